"""Training the shipped demo-av model (`workbench train-tiny`)."""
