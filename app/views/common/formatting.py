"""Numbers as the views write them."""
from __future__ import annotations


def human_bytes(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number under 1024: '512 B', '1.5 MiB', '2.0 TiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
