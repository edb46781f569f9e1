"""Images for vision-language models: references loaded and checked, the processor's inputs, 3D positions."""
