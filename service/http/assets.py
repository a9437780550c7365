"""Files served from the package by name (service/http/static/): the vendored Swagger UI behind
/docs (docs_ui.py) and the web page's own files (web_ui.py).

A fixed allow-list rather than a static mount of a folder: a name from the URL is never joined
to a path unless it is one of the listed names, so there is no traversal to guard against, and
what else sits in the folder (READMEs, licences) stays unserved."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse


def require_files(directory: Path, names: Iterable[str], what: str) -> None:
    """Raises FileNotFoundError naming the missing files, so that a wheel or image built
    without the package data fails when the app is built rather than with a blank page."""
    missing = [name for name in names if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{what} missing from {directory}: {missing}")


def add_asset_route(
    router: APIRouter,
    prefix: str,
    directory: Path,
    assets: Mapping[str, str],
    cache_control: str,
) -> None:
    """GET {prefix}/{name}: `directory / name` when `name` is a key of `assets` (file name ->
    media type), else 404. The files must exist (require_files)."""
    require_files(directory, assets, f"assets of {prefix}")

    @router.get(f"{prefix}/{{name}}", include_in_schema=False)
    async def asset(name: str) -> FileResponse:
        media_type = assets.get(name)
        if media_type is None:
            raise HTTPException(status_code=404, detail="Not Found")
        return FileResponse(
            directory / name, media_type=media_type, headers={"Cache-Control": cache_control}
        )
