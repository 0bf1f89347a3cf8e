"""What plugins return and how the core writes it: :class:`Results` and report sections
(:mod:`advopenood.outputs.results`), the report (:mod:`advopenood.outputs.report`) and plots
(:mod:`advopenood.outputs.plots`). ``from advopenood.outputs import Results, Section, Table`` is the path an
evaluator or analysis uses."""
from typing import Any

from advopenood.deprecated import removed
from advopenood.outputs.results import (
                                        SECTIONS_FILE,
                                        Bullets,
                                        Figure,
                                        Item,
                                        Paragraph,
                                        Results,
                                        Section,
                                        Table,
                                        as_results,
                                        as_written,
                                        collect,
                                        guarded,
                                        read_sections,
                                        relative,
                                        write_sections,
                                        write_tables,
)

__all__ = ["SECTIONS_FILE", "Bullets", "Figure", "Item", "Paragraph", "Results", "Section", "Table", "as_results", "as_written",
           "collect", "guarded", "read_sections", "relative", "write_sections", "write_tables"]


def __getattr__(name: str) -> Any:
    """A name this module held before the split fails naming where it lives now (removed in 0.3.0)."""
    raise removed(__name__, name)
