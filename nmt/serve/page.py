"""The web page (nmt/web/) a server answers at / and /app.js."""

from importlib import resources

from fastapi.responses import Response

PAGE_FILES = {"/": ("index.html", "text/html"), "/app.js": ("app.js", "text/javascript")}


def static_page(content: str, media_type: str):
    """A GET endpoint that answers with fixed content (FastAPI reads no parameters from it)."""
    async def page() -> Response:
        return Response(content, media_type=media_type)
    return page


def add_page(app) -> None:
    """Serve nmt/web/ at / and /app.js, replacing LitServe's "litserve running" at /."""
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) != "/"]
    web = resources.files("nmt") / "web"
    for route, (filename, media_type) in PAGE_FILES.items():
        content = (web / filename).read_text(encoding="utf-8")
        app.add_api_route(route, static_page(content, media_type), methods=["GET"],
                          include_in_schema=False)
