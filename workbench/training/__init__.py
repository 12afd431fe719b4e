"""Training the shipped models (`workbench train-tiny`): preset av2 makes demo-av, preset demo-av makes demo-av-mini."""
