"""The Hydra config tree of `python -m tgo.train` and `python -m tgo.observe`, installed as ``tgo.conf``.

A package only so that Hydra finds it as ``pkg://tgo.conf`` wherever TGO is installed; it holds YAML, no code.
"""
