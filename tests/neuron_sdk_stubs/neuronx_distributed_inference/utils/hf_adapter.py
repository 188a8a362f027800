"""STUB (tests only)."""


def load_pretrained_config(model_path):
    return model_path
