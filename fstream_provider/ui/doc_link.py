"""The Providers page links ``fstream`` to the how-to pages this plugin serves: set as the api-server starts.

Airflow's *Admin → Providers* links a provider's name to its ``documentation_url``, which Airflow takes only from
the distribution's ``Project-URL: Documentation`` (``providers_discovery``, overwriting any of the provider info);
without one the UI links ``https://airflow.apache.org/docs/<package>/<version>/``, a page Apache does not publish
for ``fstream``. The project has no web site, and a package index refuses a project URL that is not absolute, so
setup.cfg names none (issue 39). The plugin sets the link instead, where only the api-server runs it: the root
middleware below is built once per api-server process, and points the ``fstream`` entry at the relative
``fstream/docs/index.md``, which the browser resolves against the UI's ``<base href>`` to the pages
``fstream_provider.ui.app`` serves under ``/fstream/docs``.
"""

from __future__ import annotations

from typing import Any

from fstream_provider.model.plot import PLOT_MOUNT

DOCS_HREF = PLOT_MOUNT.strip("/") + "/docs/index.md"


def link_providers_page() -> bool:
    """Point the ``fstream`` provider's documentation URL at the plugin's pages, unless the distribution names one;
    True when it was set."""
    from airflow.providers_manager import ProvidersManager

    info = ProvidersManager().providers.get("fstream")
    if info is None or info.data.get("documentation-url"):
        return False
    info.data["documentation-url"] = DOCS_HREF
    return True


class ProvidersPageLink:
    """A pass-through ASGI middleware (``fastapi_root_middlewares``): the api-server builds it once, at start,
    and building it runs :func:`link_providers_page`; other Airflow processes never build it.

    :param app: the ASGI app it wraps.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        link_providers_page()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
