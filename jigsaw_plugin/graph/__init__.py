"""Sub-stage graphs: SubStage, SubStageGraph (networkx), builders, validation, export.

See docs/graph.md. The ``jigsaw graph`` command lives in :mod:`jigsaw_plugin.graph.command`.
"""

from jigsaw_plugin.graph.export import from_json, to_dot, to_json, to_png
from jigsaw_plugin.graph.from_events import build_from_events
from jigsaw_plugin.graph.from_spec import build_from_spec
from jigsaw_plugin.graph.graph import EDGE_KINDS, GROUP_KINDS, GraphError, SubStageGraph
from jigsaw_plugin.graph.substage import KINDS, RESOURCES, SubStage

__all__ = [
    "EDGE_KINDS",
    "GROUP_KINDS",
    "KINDS",
    "RESOURCES",
    "GraphError",
    "SubStage",
    "SubStageGraph",
    "build_from_events",
    "build_from_spec",
    "from_json",
    "to_dot",
    "to_json",
    "to_png",
]
