"""Where the `fleet` package this process runs lives: the directory that holds it.

A fleet's zygote imports fleet from there (its table layout, FSM and ring protocol must
be its supervisor's), whatever else its working directory or environment would put
first (a folder named fleet, another install), and says it back at boot, where the
supervisor checks it (`fleet.runtime.zygote_link`).
"""
import os

FLEET_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
