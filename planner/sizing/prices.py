"""What a GPU-hour costs, as the user states it: ``--price h100=2.5,h200=3.4`` or ``--prices
FILE`` (TOML or JSON).  No price is built in: prices differ by provider, region, contract and
month, so a sweep without one reports GPU-hours and leaves cost out.

A file holds a mapping of GPU name (any catalog name or alias) to the price of one GPU-hour,
at the top level or under ``[prices]``, with an optional ``currency`` (default ``$``)::

    currency = "$"
    [prices]
    h100 = 2.5
    h200 = 3.4

Every malformed entry is an input error naming it (exit code 2 in the CLI).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from planner.catalog.hardware import get_gpu
from planner.errors import PlanInputError, ResourceLimitError

MAX_PRICE_FILE_BYTES = 1 << 20
MAX_PRICE = 1e6  # per GPU-hour; anything above is a typo (cents? a cluster?)


@dataclass(frozen=True)
class PriceTable:
    """Price of one GPU-hour per GPU catalog name."""

    per_gpu_hour: tuple[tuple[str, float], ...]
    currency: str = "$"
    source: str = "--price"

    def price(self, gpu_name: str) -> float | None:
        return dict(self.per_gpu_hour).get(gpu_name)

    @property
    def gpu_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.per_gpu_hour)

    def to_dict(self) -> dict:
        return {"currency": self.currency, "per_gpu_hour": dict(self.per_gpu_hour),
                "source": self.source}


def _price(name: str, value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanInputError(f"{where}: price of {name!r} is {value!r}, not a number "
                             f"(the price of one GPU-hour, e.g. {name}=2.5)")
    value = float(value)
    if not math.isfinite(value) or not 0 < value <= MAX_PRICE:
        raise PlanInputError(f"{where}: price of {name!r} is {value!r}; valid: a number above "
                             f"0 and at most {MAX_PRICE:g} per GPU-hour")
    return value


def _table(entries: list[tuple[str, object]], where: str, currency: str = "$") -> PriceTable:
    if not entries:
        raise PlanInputError(f"{where}: no prices; give GPU=PRICE pairs such as h100=2.5")
    prices: dict[str, float] = {}
    for name, value in entries:
        try:
            gpu = get_gpu(str(name))
        except PlanInputError as error:
            raise PlanInputError(f"{where}: {error}") from None
        if gpu.name in prices:
            raise PlanInputError(f"{where}: {gpu.name} is priced twice ({name!r} is another "
                                 f"name for it)")
        prices[gpu.name] = _price(str(name), value, where)
    return PriceTable(per_gpu_hour=tuple(prices.items()), currency=currency, source=where)


def parse_prices(text: str) -> PriceTable:
    """``h100=2.5,h200=3.4`` (price of one GPU-hour per GPU type)."""
    entries = []
    for part in str(text).split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise PlanInputError(f"--price {text!r}: {part.strip()!r} is not GPU=PRICE "
                                 f"(e.g. --price h100=2.5,h200=3.4)")
        try:
            number = float(value.strip())
        except ValueError:
            number = value.strip()  # _price names it
        entries.append((name.strip(), number))
    return _table(entries, f"--price {text!r}")


def _load(path: Path, where: str) -> object:
    try:
        size = path.stat().st_size
    except OSError as error:
        raise PlanInputError(f"{where}: cannot read it ({error.strerror or error})") from None
    if size > MAX_PRICE_FILE_BYTES:
        raise ResourceLimitError(f"{where} is {size:,} bytes; a price table is at most "
                                 f"{MAX_PRICE_FILE_BYTES:,}")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise PlanInputError(f"{where}: cannot read it ({error.strerror or error})") from None
    if path.suffix.lower() == ".json":
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as error:
            raise PlanInputError(f"{where} is not valid JSON ({error})") from None
    if path.suffix.lower() != ".toml":
        raise PlanInputError(f"{where}: a price table is a .toml or .json file")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise PlanInputError(f"{where}: reading TOML needs Python 3.11+ or the tomli "
                                 f"package; write the table as JSON instead") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise PlanInputError(f"{where} is not valid TOML ({error})") from None


def read_prices(path: Path) -> PriceTable:
    """A TOML or JSON price table (see the module docstring)."""
    where = f"--prices {str(path)!r}"
    data = _load(path, where)
    if not isinstance(data, dict):
        raise PlanInputError(f"{where}: expected a table of GPU = price, got "
                             f"{type(data).__name__}")
    currency = data.get("currency", "$")
    if not isinstance(currency, str) or not 0 < len(currency) <= 8:
        raise PlanInputError(f"{where}: currency {currency!r} is not a short text like \"$\"")
    table = data.get("prices", None)
    if table is None:
        table = {key: value for key, value in data.items() if key != "currency"}
    elif not isinstance(table, dict):
        raise PlanInputError(f"{where}: [prices] must be a table of GPU = price")
    elif set(data) - {"prices", "currency"}:
        extra = sorted(set(data) - {"prices", "currency"})
        raise PlanInputError(f"{where}: unexpected keys {extra} beside [prices]")
    return _table(list(table.items()), where, currency)
