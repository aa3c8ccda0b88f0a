"""verl entry point (group ``verl.plugins``), loaded by ``import verl`` in every verl process.

Declared in pyproject.toml as ``jigsaw = "jigsaw_plugin.adapters.verl.entrypoint"``. It
registers the jigsaw trainers (``trainer.v1.trainer_mode=jigsaw``) and the version-guarded
patches; see ``plugin.py``. verl swallows plugin exceptions (``verl/__init__.py:72-76``), so
nothing escapes from here: failures go to stderr and make the jigsaw trainer refuse to start.
"""

import sys

try:
    from jigsaw_plugin.adapters.verl import plugin as _plugin
except Exception as _e:  # nothing else can report it: verl logs plugin errors at DEBUG
    print(f"jigsaw-plugin (verl): the plugin does not import: {_e!r}", file=sys.stderr, flush=True)
else:
    try:
        _plugin.load()
    except Exception as _e:
        _plugin.report_failure("entry point", _e)
