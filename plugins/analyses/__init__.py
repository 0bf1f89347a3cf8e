"""The built-in analyses, a package each: ``<name>/plugin.py`` (the analysis), ``<name>/report.py`` (its report
section, where it has one of its own) and its ``verify`` hook. The entry points of group ``advopenood.analyses`` name
each ``<name>.plugin`` of :data:`MODULES` (``setup.py`` reads it: one list). Importing this
package registers nothing.
"""

#: the analyses' packages, in the order the entry points load them
MODULES = ("bintest", "gradcam", "transfer")
