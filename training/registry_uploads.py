"""Upload a model as an archive: unpack it safely into the project's folder, then register it.

A project's researchers upload a .tar.gz, .tgz, .tar or .zip archive; it is unpacked into
``ARTIFACT_ROOT/models/project-<id>/`` and registered like any other version (``training.registry``
keeps the checks, the registration and the validation job). Only regular files and folders are
taken: absolute names, ``..``, links and device files refuse the archive, and so do more than
``PREFLOOP_MODEL_UNPACKED_MAX_BYTES`` once unpacked. A refusal is a 400 (413 past a size limit)
naming the field, and nothing is left on disk.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tarfile
import uuid
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO, Any

from django.conf import settings

from training.models import ModelVersion
from training.registry import (
    CHUNK,
    InvalidRegistration,
    _check_kind,
    _check_name,
    _check_prompt_format,
    _create,
    model_version_validation_enqueue,
)

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
MAX_ARCHIVE_MEMBERS = 10_000
# What a multipart body may carry besides the archive (the other fields, part headers).
MULTIPART_OVERHEAD_BYTES = 1 << 20


def project_models_root(*, project) -> Path:
    """Return the folder of a project's uploaded models."""
    return Path(settings.ARTIFACT_ROOT) / "models" / f"project-{project.pk}"


def _size_text(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def upload_declared_size_check(*, content_length: Any) -> None:
    """Refuse (413) a request that declares a body too large for any archive, before reading it."""
    try:
        declared = int(content_length or 0)
    except (TypeError, ValueError):
        return
    limit = settings.PREFLOOP_MODEL_UPLOAD_MAX_BYTES
    if declared > limit + MULTIPART_OVERHEAD_BYTES:
        raise InvalidRegistration(
            f"the archive is larger than {_size_text(limit)} (PREFLOOP_MODEL_UPLOAD_MAX_BYTES); "
            "nothing was kept.",
            field="file",
            status=413,
        )


def model_version_upload(
    *,
    project,
    name: Any,
    kind: Any,
    upload,
    prompt_format: Any = "",
    enqueue: bool = True,
) -> ModelVersion:
    """Unpack an uploaded archive into the project's folder and register it (researchers).

    ``upload`` is a Django UploadedFile (``.name``, ``.size``, ``.file``). Refused whole,
    with nothing left on disk: a file past PREFLOOP_MODEL_UPLOAD_MAX_BYTES (413), an unsafe
    member, more than PREFLOOP_MODEL_UNPACKED_MAX_BYTES unpacked (413), no config.json.
    """
    name, kind = _check_name(name), _check_kind(kind)
    prompt_format = _check_prompt_format(prompt_format)
    if upload is None:
        raise InvalidRegistration("attach a .tar.gz, .tgz, .tar or .zip archive.", field="file")
    limit = settings.PREFLOOP_MODEL_UPLOAD_MAX_BYTES
    if upload.size > limit:
        raise InvalidRegistration(
            f"the archive is larger than {_size_text(limit)} (PREFLOOP_MODEL_UPLOAD_MAX_BYTES); "
            "nothing was kept.",
            field="file",
            status=413,
        )
    file_name = (upload.name or "").lower()
    if not file_name.endswith(ARCHIVE_SUFFIXES):
        raise InvalidRegistration(
            f"expected an archive named {', '.join(ARCHIVE_SUFFIXES)}.", field="file"
        )

    root = project_models_root(project=project)
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".upload-{uuid.uuid4().hex}"
    final = root / f"{name}-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir()
        upload.file.seek(0)
        if file_name.endswith(".zip"):
            _unpack_zip(upload.file, staging)
        else:
            _unpack_tar(upload.file, staging)
        folder = _model_folder_in(staging)
        os.rename(folder, final)
        version = _create(
            name=name,
            kind=kind,
            artifact_path=str(final),
            project=project,
            source=ModelVersion.Source.UPLOAD,
            validation={"prompt_format": prompt_format},
        )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        _remove_if_empty(root)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    if enqueue:
        model_version_validation_enqueue(version=version)
    return version


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
        folder.parent.rmdir()  # models/ too, when this was its only project
    except OSError:
        pass


def _model_folder_in(staging: Path) -> Path:
    """Return the unpacked model folder: the archive's top, or its one top-level folder."""
    if (staging / "config.json").is_file():
        return staging
    entries = [p for p in staging.iterdir() if not p.name.startswith("__MACOSX")]
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / "config.json").is_file():
        return entries[0]
    raise InvalidRegistration(
        "no config.json at the top of the archive or in its one top-level folder.",
        field="file",
    )


def _unsafe(message: str) -> InvalidRegistration:
    return InvalidRegistration(f"unsafe archive, nothing was kept: {message}", field="file")


def _member_path(name: str, staging: Path) -> Path | None:
    """Return where a member goes inside ``staging``; refuse names that could leave it."""
    if not name or "\x00" in name or "\\" in name:
        raise _unsafe(f"member {name!r} has a name that is not a plain relative path.")
    pure = PurePosixPath(name)
    if pure.is_absolute() or re.match(r"^[A-Za-z]:", name):
        raise _unsafe(f"member {name!r} has an absolute path.")
    if ".." in pure.parts:
        raise _unsafe(f"member {name!r} goes up a folder ('..').")
    parts = [p for p in pure.parts if p not in ("", ".")]
    if not parts:
        return None  # the archive's own top folder "./"
    target = staging.joinpath(*parts)
    if staging.resolve() not in target.resolve().parents:
        raise _unsafe(f"member {name!r} would be written outside the upload's folder.")
    return target


class _Budget:
    """The bytes an archive may still unpack to."""

    def __init__(self):
        self.limit = settings.PREFLOOP_MODEL_UNPACKED_MAX_BYTES
        self.left = self.limit

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise InvalidRegistration(
                f"the archive unpacks to more than {_size_text(self.limit)} "
                "(PREFLOOP_MODEL_UNPACKED_MAX_BYTES); nothing was kept.",
                field="file",
                status=413,
            )


def _write_member(source: IO[bytes], target: Path, budget: _Budget, name: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(target, flags, 0o644)
    except FileExistsError as exc:
        raise _unsafe(f"member {name!r} appears twice.") from exc
    with os.fdopen(fd, "wb") as out:
        while chunk := source.read(CHUNK):
            budget.take(len(chunk))
            out.write(chunk)


def _unpack_tar(fileobj: IO[bytes], staging: Path) -> None:
    try:
        archive = tarfile.open(fileobj=fileobj, mode="r:*")  # noqa: SIM115 - closed below
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InvalidRegistration(f"not a readable tar archive ({exc}).", field="file") from exc
    budget = _Budget()
    with archive:
        try:
            members = archive.getmembers()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise InvalidRegistration(f"the tar archive is damaged ({exc}).", field="file") from exc
        if len(members) > MAX_ARCHIVE_MEMBERS:
            raise _unsafe(f"more than {MAX_ARCHIVE_MEMBERS} members.")
        # Every member is checked before a byte is written.
        declared = 0
        for member in members:
            _member_path(member.name, staging)
            if not (member.isfile() or member.isdir()):
                what = "a link" if member.issym() or member.islnk() else "a device or fifo"
                raise _unsafe(f"member {member.name!r} is {what}; only files and folders.")
            declared += member.size if member.isfile() else 0
        budget.take(declared)
        budget.left = budget.limit  # counted again, for real, while writing
        for member in members:
            target = _member_path(member.name, staging)
            if target is None:
                continue
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            source = archive.extractfile(member)
            try:
                _write_member(source, target, budget, member.name)
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise InvalidRegistration(
                    f"the tar archive is damaged at {member.name!r} ({exc}).", field="file"
                ) from exc


def _unpack_zip(fileobj: IO[bytes], staging: Path) -> None:
    try:
        archive = zipfile.ZipFile(fileobj)
    except (zipfile.BadZipFile, OSError) as exc:
        raise InvalidRegistration(f"not a readable zip archive ({exc}).", field="file") from exc
    budget = _Budget()
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_ARCHIVE_MEMBERS:
            raise _unsafe(f"more than {MAX_ARCHIVE_MEMBERS} members.")
        declared = 0
        for info in infos:
            _member_path(info.filename, staging)
            # Unix file type bits, when the archiver wrote them (0: a plain file).
            mode = info.external_attr >> 16
            if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise _unsafe(f"member {info.filename!r} is a link or device; only files.")
            if info.flag_bits & 0x1:
                raise _unsafe(f"member {info.filename!r} is encrypted.")
            declared += info.file_size
        budget.take(declared)
        budget.left = budget.limit
        for info in infos:
            target = _member_path(info.filename, staging)
            if target is None:
                continue
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            try:
                with archive.open(info) as source:
                    _write_member(source, target, budget, info.filename)
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise InvalidRegistration(
                    f"the zip archive is damaged at {info.filename!r} ({exc}).", field="file"
                ) from exc
