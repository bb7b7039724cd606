"""transformers' native ports of families published with hub code of their own.

nomic-embed-text (`nomic_bert`) and jina-embeddings-v3's `-hf` conversions (`jina_embeddings_v3`)
load as they are: transformers reads their config and renames their weights at load.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

#: model_type -> transformers' native port of a family published with hub code.
NATIVE_PORTS = {
    "nomic_bert": "transformers.models.nomic_bert",
    "jina_embeddings_v3": "transformers.models.jina_embeddings_v3",
}
#: The architectures a port serves where it does not serve all of its model_type's.
_SERVED: dict[str, tuple[str, ...]] = {}


def native_port(model_type: str, architectures: Sequence[str] = ()) -> str | None:
    """transformers' own module for a family published with hub code, when installed."""
    module = NATIVE_PORTS.get(model_type)
    served = _SERVED.get(model_type)
    if module is None or (served is not None and not any(a in served for a in architectures)):
        return None
    try:
        return module if importlib.util.find_spec(module) is not None else None
    except ImportError:
        return None


def port_name(model_type: str) -> str:
    """The port's own name, as `/models` shows it."""
    return NATIVE_PORTS.get(model_type, model_type).rsplit(".", 1)[-1]
