"""advopenood: adversarial robustness evaluation for OpenOOD's post-hoc OOD detectors."""
import ast
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
#: the core's packages, one per stage of a run (see ARCHITECTURE.md)
STAGES = ("config", "data", "models", "attacks", "detection", "evaluation", "outputs", "run", "cli")
VERSION = (HERE / "advopenood" / "VERSION").read_text().strip()
KINDS = ("attacks", "detectors", "evaluators", "analyses")


def plugin_modules(kind: str) -> tuple[str, ...]:
    """``MODULES`` of ``plugins/<kind>/__init__.py``, read without importing it: one entry point each."""
    tree = ast.parse((HERE / "plugins" / kind / "__init__.py").read_text())
    return next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "MODULES")


#: the built-in plugins' modules per kind, as each kind's ``plugins/<kind>/__init__.py`` lists them
PLUGIN_MODULES = {kind: plugin_modules(kind) for kind in KINDS}


setup(
    name="advopenood",
    version=VERSION,
    description="Do post-hoc OOD detectors still work when the input is adversarial? An OpenOOD plugin.",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    # `plugins/` is installed as `advopenood_plugins`, `configs/` as `advopenood.configs`.
    packages=["advopenood", *(f"advopenood.{stage}" for stage in STAGES), "advopenood.configs", "advopenood_plugins",
              "advopenood_plugins.kit", *(f"advopenood_plugins.{kind}" for kind in KINDS),
              *(f"advopenood_plugins.{kind}.{m}" for kind in ("evaluators", "analyses")
                for m in PLUGIN_MODULES[kind])],
    package_dir={"advopenood": "advopenood", "advopenood.configs": "configs", "advopenood_plugins": "plugins"},
    package_data={"advopenood": ["VERSION"], "advopenood.configs": ["*.yaml", "openood/*.yml", "benchmarks/*.yaml"]},
    install_requires=[
        "torch>=2.6",  # torch.load's weights_only=True default and allow-list (we load no pickle)
        "torchvision>=0.21",
        "foolbox>=3.3,<3.4",
        "pyautoattack>=0.2,<0.3",
        "timm>=0.9",
        "eagerpy>=0.30",
        "grad-cam>=1.4",
        "scikit-image>=0.20",
        "pandas>=1.5",
        "jinja2>=3.1",  # pandas' LaTeX writer (tables.tex)
        "scikit-learn>=1.2",
        "pytorch-ood>=0.2",
        "scipy<2",
        "tqdm>=4.60",
        "pyyaml>=6",
        "pydantic>=2.5,<3",
        "packaging>=21",
        "threadpoolctl>=3",
        "matplotlib>=3.6",
    ],
    extras_require={
        # OpenOOD is not on PyPI (nor is advopenood): install it from its repository first, without its own
        # requirements (they ask for faiss-gpu, opencv-python, pre-commit and pins we do not want):
        #   git clone https://github.com/Jingkang50/OpenOOD && pip install --no-deps -e OpenOOD
        # then, from this checkout, `pip install -e '.[openood]'` adds what importing OpenOOD's evaluation API needs
        # (openood.evaluation_api imports foolbox too). imgaug must come separately, `pip install --no-deps imgaug`,
        # because its requirements name opencv-python, which clashes with the headless build; the extra lists what
        # it needs at import instead (six ... Shapely). libmr builds from source:
        # `pip install Cython numpy && pip install --no-build-isolation libmr`. Under NumPy 2, imgaug needs the
        # three-line patch in docs/openood.md, "Installing OpenOOD (and the imgaug patch for NumPy 2)".
        "openood": ["faiss-cpu", "statsmodels", "diffdist", "timm", "gdown", "opencv-python-headless", "json5",
                    "foolbox>=3.3,<3.4", "six", "scipy<2", "Pillow", "matplotlib", "scikit-image", "imageio",
                    "Shapely"],
        # RobustBench's model zoo (`model.arch: robustbench:<dataset>/<threat>/<model_id>`): install robustbench itself
        # with `pip install --no-deps robustbench==1.1.1` (its metadata pins timm==1.0.9 and gdown==5.1.0, which
        # would replace the timm this package uses; advopenood imports only its model zoo), then this extra adds the
        # two packages the zoo's architectures import. docs/models.md, "Installing robustbench (one environment that keeps working)".
        "robustbench": ["geotorch>=0.3", "torchdiffeq>=0.2"],
        "test": ["pytest>=7", "pytest-xdist>=3", "setuptools>=64", "wheel", "import-linter>=2.1,<3"],
        # the manual: `mkdocs build --strict` (mkdocs.yml); mkdocstrings reads the sources without importing them
        "docs": ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=1,<2",
                 "mkdocstrings-python>=2,<3", "griffe-sphinx>=0.3,<1"],
    },
    entry_points={
        "console_scripts": ["advopenood = advopenood.cli:main"],
        "advopenood.attacks": [f"{m} = advopenood_plugins.attacks.{m}" for m in PLUGIN_MODULES["attacks"]],
        "advopenood.detectors": [f"{m} = advopenood_plugins.detectors.{m}" for m in PLUGIN_MODULES["detectors"]],
        "advopenood.evaluators": [f"{m} = advopenood_plugins.evaluators.{m}.plugin"
                                  for m in PLUGIN_MODULES["evaluators"]],
        "advopenood.analyses": [f"{m} = advopenood_plugins.analyses.{m}.plugin" for m in PLUGIN_MODULES["analyses"]],
    },
)
