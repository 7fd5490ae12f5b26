"""The web console at `/console` (SPEC §2.3, §2.4, §5.3): static assets shipped in the package,
served by the front with a strict Content-Security-Policy. The page is one more client of the
REST API, with the caller's own token in the `Authorization` header: it can show only what the
API shows that token. Nothing is fetched from anywhere else (`connect-src 'self'`)."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

ASSETS = {"console.js": "text/javascript", "console.css": "text/css",
          "icon.svg": "image/svg+xml"}
# No inline script or style, nothing from another origin, no framing, no form posts, no base.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
           "Cache-Control": "no-store", "Cross-Origin-Opener-Policy": "same-origin"}


def _asset(name: str) -> bytes:
    return resources.files("memgate.adapters").joinpath("console", name).read_bytes()


def router() -> APIRouter:
    routes = APIRouter(prefix="/console", include_in_schema=False)
    files = {name: _asset(name) for name in (*ASSETS, "index.html")}  # read once, at start

    @routes.get("")
    async def console_page() -> Response:
        return Response(files["index.html"], media_type="text/html; charset=utf-8",
                        headers=HEADERS)

    def serve(name: str, media_type: str) -> None:
        async def asset() -> Response:
            return Response(files[name], media_type=f"{media_type}; charset=utf-8",
                            headers=HEADERS)

        routes.add_api_route(f"/{name}", asset, methods=["GET"], name=f"console_{name}")

    for name, media_type in ASSETS.items():
        serve(name, media_type)
    return routes
