"""Packs that travel: export a published version as one archive, validate it, install it.

- :mod:`kpack.archive.format`: the members of an archive, its header and the limits of both;
- :mod:`kpack.archive.export`: writing the archive of a published version;
- :mod:`kpack.archive.reader`: reading one in a single bounded pass (memory, bytes, time);
- :mod:`kpack.archive.validate`: the checks of a pack or an archive, without installing;
- :mod:`kpack.archive.install`: verifying an archive and publishing it as a version;
- :mod:`kpack.archive.staging`: the packs folder's staging area, cleaned after a kill.

A URL is downloaded first with kpack.download (an overall deadline and a size cap).
"""

from kpack.archive.export import ExportResult, export_pack
from kpack.archive.format import ARCHIVE_MANIFEST, SUFFIX, member_problem
from kpack.archive.install import InstallResult, install
from kpack.archive.reader import Archive, open_archive
from kpack.archive.validate import Check, Report, validate, validate_archive, validate_local

__all__ = [
    "ARCHIVE_MANIFEST",
    "SUFFIX",
    "Archive",
    "Check",
    "ExportResult",
    "InstallResult",
    "Report",
    "export_pack",
    "install",
    "member_problem",
    "open_archive",
    "validate",
    "validate_archive",
    "validate_local",
]
