"""``python -m config``: rewrite the configuration table in README.md from the settings."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from config.settings import markdown_table


def main() -> int:
    readme = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    text = readme.read_text()
    new = re.sub(r"\| variable \| type \| default \| meaning \|\n(\|.*\|\n)+", markdown_table() + "\n", text, count=1)
    readme.write_text(new)
    print(f"{readme}: configuration table {'updated' if new != text else 'already current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
