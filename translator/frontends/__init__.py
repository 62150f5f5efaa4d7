"""Ways in and out of the translator besides `translate()`: the CLI, the torch.compile backend,
save / load, the ONNX importer and the HuggingFace adapter."""
