"""The notebooks run top to bottom (nbclient) on a kernel of this interpreter, from a copy of the
notebooks folder outside the checkout with the kernel's working directory elsewhere again (what a
user who copies the folder does), and each cell that should draw a figure does.

The kernel is a `python3` kernel pinned to `sys.executable` (the .venv running pytest), written
to a temporary kernelspec folder, so the notebooks import this checkout's packages whatever
kernels the machine has registered. Outputs are never written back: the notebooks stay stripped.
`make notebooks` runs them in place with `jupyter nbconvert --execute`.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# The first notebook runs in `make test` (the notebook path: kernel, imports, figures); the
# what-if and fidelity notebooks (~40-50 s each on 2 cores) run in `make test-slow`, which CI
# runs after `make test`.
DEFAULT_RUN = {"01_plan_and_simulate"}
SLOW = [pytest.mark.slow]
NOTEBOOK_MARKS = {"03": [*SLOW, pytest.mark.ray]}  # the fidelity notebook executes on Ray
CELL_TIMEOUT_S = 900  # a stuck cell fails the test instead of hanging the suite


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory, monkeypatch_module):
    """A kernelspec `placer-test` that runs this interpreter."""
    share = tmp_path_factory.mktemp("jupyter")
    spec = share / "kernels" / "placer-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "placer (test)", "language": "python"}))
    monkeypatch_module.setenv("JUPYTER_PATH", str(share))
    monkeypatch_module.setenv("MPLBACKEND", "Agg")
    return "placer-test"


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_notebooks_are_stripped():
    assert len(NOTEBOOKS) == 3, [p.name for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, path.name


@pytest.mark.notebook
@pytest.mark.parametrize("path", [
    p if p.stem in DEFAULT_RUN else pytest.param(p, marks=NOTEBOOK_MARKS.get(p.stem[:2], SLOW))
    for p in NOTEBOOKS],
    ids=lambda p: p.stem)
def test_notebook_runs_from_a_copy_elsewhere(path, kernel_env, tmp_path, monkeypatch):
    """Executed from a copy of notebooks/ in a temporary folder, the kernel's working directory a
    third, empty folder: the examples come from the package (`placer.example`), and every file a
    notebook writes goes to $PLACER_NOTEBOOK_OUT/STEM, none beside the notebook nor in the
    working directory."""
    if path.stem.startswith("03"):
        pytest.importorskip("ray")
    copy = tmp_path / "copy" / "notebooks"
    shutil.copytree(ROOT / "notebooks", copy, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    before = sorted(p.name for p in copy.iterdir())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    monkeypatch.setenv("PLACER_NOTEBOOK_OUT", str(out))
    monkeypatch.chdir(elsewhere)
    nb = nbformat.read(copy / path.name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=kernel_env,
                                     resources={"metadata": {"path": str(elsewhere)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    # no stack trace anywhere in the output (a Ray left running in the kernel printed SIGTERM
    # traces when the kernel was stopped: placer.execute stops the Ray it started)
    streams = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.outputs if o.output_type == "stream")
    assert "Traceback" not in streams and "SIGTERM" not in streams
    images = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.outputs
                 if "image/png" in o.get("data", {}))
    assert images >= 2, f"{path.name}: expected figures, got {images}"
    assert sorted(p.name for p in copy.iterdir()) == before  # nothing written beside it
    assert not list(elsewhere.iterdir())  # nor in the working directory
    assert f"outputs: {out / path.stem}" in streams  # the folder it wrote to, stated
    # it ends with the figures for a design doc, saved as PNG files under its output folder
    assert any("image/png" in o.get("data", {}) for o in nb.cells[-1].outputs), path.name
    assert list((out / path.stem).rglob("*.png")), path.name


def test_notebooks_end_with_their_design_doc_figures():
    """The figures each notebook ends with (a regression guard on the notebooks' text): the
    simulated timeline and utilisation, the cost Pareto, the fidelity and held-out figures."""
    last = {"01_plan_and_simulate": ("timeline.png", "utilization.png"),
            "02_what_if": ("plots.pareto(",),
            "03_fidelity": ("fidelity_pngs", "heldout_png")}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        code = nb.cells[-1].source
        for fig in last[path.stem]:
            assert fig in code, (path.name, fig)


def test_notebooks_find_the_examples_from_the_package():
    """No notebook reads a path relative to the working directory or changes it."""
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert "os.chdir" not in code and '"examples/' not in code, path.name
        assert "placer.example(" in code, path.name


def test_notebooks_use_the_python_api():
    """The notebooks plan, simulate and execute through `placer.plan/simulate/execute`."""
    calls = {"01_plan_and_simulate": ("placer.plan(", "placer.simulate(", "placer.compare(",
                                      "placer.export("),
             "02_what_if": ("placer.load_job(",),
             "03_fidelity": ("placer.plan(", "placer.execute(")}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert "import placer\n" in code, path.name
        for call in calls[path.stem]:
            assert call in code, (path.name, call)
