"""Adapters: what a user hands `translate()` that is not yet a module torch.export can capture.

- `hf`: a HuggingFace model -> use_cache off, attention implementation checked, a
  ``forward(*args)`` wrapper when its forward takes keyword inputs.
- `onnx_import` (+ `onnx_ops`, `onnx_patterns`): an .onnx file -> an nn.Module of aten calls;
  `onnx_truth`: ONNX Runtime's run of the file, the truth its translation is verified against.

`translate()` (translator/api.py) calls them first; the frontends (CLI, torch.compile backend,
save/load) call `translate()`. Keeping them apart keeps that one way: an adapter imports neither
the API nor a frontend.
"""
