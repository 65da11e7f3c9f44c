"""MkDocs hooks (mkdocs.yml): README.md is the site's home page, its links to ``docs/...`` made relative to it."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File
    home = re.sub(r"\]\(docs/", "](", README.read_text())
    files.append(File.generated(config, "index.md", content=home))
    return files
