"""OCI images as guest roots (``vm images pull|import|ls|rm``): the default store
(``$VM_OCI_DIR``, else ``~/.cache/vm/oci``). An image is a dict: ``digest``, ``refs``,
``size``, ``erofs`` (the read-only root file), ``source``."""

import builtins
import os
from typing import Dict, List, Sequence, Tuple, Union

from . import _native

Image = Dict[str, object]


def pull(reference: str) -> Image:
    """Pull ``reference`` (``name:tag`` or ``name@sha256:…``) and convert it."""
    return _native.images_pull(reference)


def import_(path: Union[str, "os.PathLike[str]"], names: Union[str, Sequence[str]] = ()) -> Image:
    """Import an OCI image layout directory, an oci-archive or a ``docker save`` tarball,
    under ``names``."""
    if isinstance(names, str):
        names = [names]
    return _native.images_import(os.fspath(path), builtins.list(names))


def list() -> List[Image]:  # noqa: A001 - the CLI's verb (builtins.list above)
    """Every image in the store."""
    return _native.images_list()


def remove(what: str) -> Tuple[List[str], bool]:
    """Remove a name (a digest or a 6+ hex prefix: every name of that image); returns the
    names removed and whether the image itself was deleted."""
    refs, deleted = _native.images_remove(what)
    return refs, deleted
