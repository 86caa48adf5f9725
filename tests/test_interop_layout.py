"""The interop package after its split by family (issue 36): `cyclelang.interop.families`, a package now, and
`cyclelang.interop.load` still serve what callers imported from the two long modules, the same objects the
family modules fill. (The line limit and the import circles are tests/test_layers.py's, for every package.)"""

from __future__ import annotations


def test_the_old_import_paths_still_serve():
    from cyclelang.interop import families, load, mapping
    from cyclelang.interop.families import core

    for name in families.__all__:
        assert hasattr(families, name), name
    assert families.KEYS is core.KEYS and families.CAUSAL_LM is core.CAUSAL_LM
    assert families.FAMILIES == tuple(families.READERS) and set(families.READERS) == set(families.KEYS) <= set(families.CAUSAL_LM)
    assert load.KEYS is mapping.KEYS  # what tests patch (test_families_extras: nanochat's turned rotary)
    for name in ("load_transformers", "convert_state_dict", "export_state_dict", "read_safetensors", "read_json", "implied_engine",
                 "check_config", "InteropError", "MAX_INDEX_BYTES"):
        assert hasattr(load, name), name
    # the modules that were interop/families_<group>.py, and the registry's handles on them that plans.py and load.py read
    for group in ("parallel", "routed_v3", "conv", "hybrid", "sinks", "gemma4", "delta"):
        assert getattr(families, "_" + group) is getattr(families, group), group
