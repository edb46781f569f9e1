"""What the project knows of model families, torch-free where validation reads it: the family table and the
`config.json` mapping (families.py, hf_vision.py), their checks (check.py, check_shape.py), parameter and layer
shapes (shape.py), FLOPs (flops.py); and, importing torch or transformers, the checkpoint's tensor names
(checkpoint_names.py), which transformers class loads a checkpoint (hf_model.py) and MoE routing (moe/)."""
