"""The docs run: every bash and python block of README.md and docs/guides/*.md runs, page by
page, in order, as a reader would paste them, against the real servers they start, with
the status code of every curl checked (2xx, or the status its line states as a trailing
`# 424 ...` comment). YAML blocks are loaded as specs. A block that cannot run on this
host says why, on the line before it: `<!-- docs-test: not run, <why> -->` (Neuron
hosts, Docker, Kubernetes, AWS), and the list of those reasons is checked too.

What a reader has is what the pages get: the bundled all-MiniLM-L6-v2 under its Hub id
in an offline Hugging Face cache (HF_HUB_OFFLINE=1), `./all-MiniLM-L6-v2` as a folder,
and what `scripts/demo.sh` leaves in `.neuronserve/demo/artifacts` (minilm, a reranker,
a classifier named topics). The Hub ids the tasks guide names for its other tasks are in
that cache too, as the tests' tiny random models of those tasks: the page's commands and
statuses are what is checked there, not those models' answers (tests/servers/test_tasks.py
checks every task's answers against the transformers pipelines). Each page runs in a
folder of its own, in one bash session, and in a network namespace of its own where the
host can make one (pages then run side by side, each on the ports it names: the README in
test_docs.py, the guides in test_docs_guides*.py; elsewhere they take turns); whatever
it started is stopped after it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from filelock import FileLock
from helpers import REPO, compile_artifact, hub_cache

PAGES = [REPO / "README.md", *sorted((REPO / "docs" / "guides").glob("*.md"))]
# the guides split between two test files, so that each runs beside the README's: the
# slowest of them here, every other in test_docs_guides_rest.py
GUIDES_FIRST = [
    REPO / "docs" / "guides" / p for p in ("tasks.md", "triton.md", "torchserve.md", "tei.md")
]
# the Hub ids the tasks guide compiles, and the tests' tiny model of each task (conftest)
TASK_HUB_IDS = {
    "cross-encoder/ms-marco-MiniLM-L-6-v2": "rerank",
    "dslim/bert-base-NER": "ner",
    "deepset/minilm-uncased-squad2": "qa",
    "google-bert/bert-base-uncased": "fill",
    "google/vit-base-patch16-224": "labels",
}
FENCE = re.compile(r"^```(\w+)?\s*$")
NOT_RUN = re.compile(r"<!--\s*docs-test:\s*not run,\s*(.+?)\s*-->")
# a curl line's stated answer: a trailing comment that starts with a status code
STATED = re.compile(r"#\s*(\d{3})\b[^'\"]*$")
HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass
class Block:
    page: Path
    line: int
    language: str
    text: str
    not_run: str | None


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        before = lines[start - 1] if start else ""
        said = NOT_RUN.search(before)
        found.append(
            Block(
                page,
                start + 1,
                opened.group(1) or "",
                "\n".join(lines[start + 1 : i]),
                said.group(1) if said else None,
            )
        )
        i += 1
    return found


def _logical_lines(text: str) -> list[str]:
    out: list[str] = []
    for line in text.splitlines():
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1] + "\n" + line
        else:
            out.append(line)
    return out


def as_script(block: Block) -> str:
    """A block as bash: curl commands with the status they must answer, python blocks
    run by the environment's python."""
    # each block's header says how far into the page it began
    header = f'echo "## {block.page.relative_to(REPO)}:{block.line} (${{SECONDS}}s)"\n'
    if block.language == "python":
        return f"{header}python - <<'PYTHON'\n{block.text}\nPYTHON\n"
    lines = []
    for line in _logical_lines(block.text):
        stated = STATED.search(line)
        if line.lstrip().startswith("curl ") and stated:
            line = f"EXPECT={stated.group(1)} {line}"
        lines.append(line)
    return header + "\n".join(lines) + "\n"


PREAMBLE = r"""
set -euo pipefail
# every curl answers what the page says: 2xx, or the status its line states
curl() {
  local body status
  body=$(mktemp)
  status=$(command curl -sS -o "$body" -w '%{http_code}' "$@") || { cat "$body"; return 1; }
  cat "$body"; echo
  if [[ ! $status =~ ^${EXPECT:-2[0-9][0-9]}$ ]]; then
    echo "docs-test: curl $* answered $status, the page says ${EXPECT:-2xx}" >&2
    return 1
  fi
}
stop_all() {
  for d in $(find . -name front.pid -printf '%h\n' 2>/dev/null); do
    neuronserve serve front --stop --run-dir "$d" >/dev/null 2>&1 || true
  done
  # what a page started itself, as its readers do (tritonserver in the background)
  torchserve --stop >/dev/null 2>&1 || true
  for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
  wait || true
}
trap stop_all EXIT
# offline for neuronserve's downloads (the bundled model is in the Hugging Face cache);
# not for the pages' clients, which huggingface_hub's offline mode would stop at once
neuronserve() { HF_HUB_OFFLINE=1 command neuronserve "$@"; }
"""


def make_reader(
    tmp_path_factory, built_once, minilm_dir, minilm_artifact, task_models, classifier_dir
):
    """What a reader of the docs has (see the module's doc), and their environment."""
    root = tmp_path_factory.mktemp("docs")
    cache = hub_cache(root / "hf" / "hub", HUB_ID, minilm_dir)
    for hub_id, task_model in TASK_HUB_IDS.items():
        hub_cache(cache, hub_id, task_models[task_model][0])
    demo = root / "demo-artifacts"
    shutil.copytree(minilm_artifact, demo / "minilm")
    # the demo's reranker and classifier stand-ins: tiny models compiled under the names
    # scripts/demo.sh gives its own (an artifact's name is recorded when it is compiled),
    # once for every docs file
    stand_ins = {
        "reranker": (task_models["rerank"][0], "rerank"),
        "topics": (classifier_dir, "text-classification"),
    }
    for name, (model, task) in stand_ins.items():
        built = built_once(
            f"docs-{name}",
            lambda out, name=name, model=model, task=task: compile_artifact(
                out / name, model, task
            ),
        )
        shutil.copytree(built, demo / name)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HF_HUB_CACHE": str(cache),
        # one artifact cache for every docs file: a page serving a Hub id another page
        # compiled finds it there (each key's compile holds a lock; the second waits)
        "NEURONSERVE_CACHE": str(built_once("docs-cache", lambda out: out / "cache")),
    }
    return root, demo, env


def page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


# a page's own /dev/shm, as a container has: a tritonserver a page starts itself passes
# its requests through regions there, never in the host's (where other tests watch)
OWN_SHM = "mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm"


def _own_network() -> list[str] | None:
    """The command that runs a page in a network namespace of its own, its loopback up
    (its servers on the ports it names, beside another page's on the same ones), and a
    /dev/shm of its own; None where this host cannot make them (no unshare or ip, no
    privilege, no user namespaces)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return None
    prefix = [
        "unshare", "--net", "--mount", "--propagation", "private",
        *([] if os.geteuid() == 0 else ["--map-root-user"]),
    ]  # fmt: skip
    try:
        made = subprocess.run(
            [*prefix, "sh", "-c", f"ip link set lo up && {OWN_SHM}"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return prefix if made.returncode == 0 else None


OWN_NETWORK = _own_network()
# where pages cannot have a network of their own, they take turns on the host's
TURNS = Path(tempfile.gettempdir()) / f"neuronserve-docs-pages-{os.getuid()}.lock"


def run_page(page: Path, reader) -> None:
    """Every block of `page` as a reader runs it (see the module's doc)."""
    root, demo, env = reader
    found = blocks(page)
    for b in found:
        if b.language == "yaml" and b.not_run is None:
            from neuronserve.spec import load_spec

            assert isinstance(yaml.safe_load(b.text), dict)
            spec_file = root / f"{page.stem}-{b.line}.yaml"
            spec_file.write_text(b.text)
            load_spec(spec_file)  # a spec the page shows is one neuronserve takes
    runnable = [b for b in found if b.language in ("bash", "python") and b.not_run is None]
    if page.name == "README.md":
        runnable = runnable[1:]  # the set-up commands: the CI's own (scripts/test.sh, demo)
    if not runnable:
        pytest.skip("no block to run")
    work = root / page.stem
    work.mkdir()
    # the page's own copies (hard links: cheap), so that a page writing over one changes
    # nothing for the next
    shutil.copytree(demo, work / ".neuronserve" / "demo" / "artifacts", copy_function=os.link)
    if page.name != "README.md":  # the README compiles its own
        shutil.copytree(demo / "minilm", work / "artifacts" / "minilm", copy_function=os.link)
    shutil.copytree(env_model(env), work / "all-MiniLM-L6-v2", copy_function=os.link)
    script = PREAMBLE + "\n".join(as_script(b) for b in runnable) + 'echo "## end (${SECONDS}s)"\n'
    (work / "page.sh").write_text(script)
    # a temporary folder of the page's own: a TorchServe it starts keeps its pid file and
    # its workers' sockets there (/tmp/.model_server.pid, /tmp/.ts.sock.9000: the same
    # names for every TorchServe on the host, shared across network namespaces), so it
    # neither waits on another's workers nor stops another TorchServe
    tmp = work / "tmp"
    tmp.mkdir()
    page_env = {**env, "TMPDIR": str(tmp), "TEMP": str(tmp)}
    run = dict(cwd=work, env=page_env, capture_output=True, text=True, timeout=900)
    try:
        if OWN_NETWORK is not None:
            script_cmd = f"ip link set lo up && {OWN_SHM} && exec bash page.sh"
            done = subprocess.run([*OWN_NETWORK, "bash", "-c", script_cmd], **run)
        else:
            with FileLock(TURNS):
                done = subprocess.run(["bash", "page.sh"], **run)
    except subprocess.TimeoutExpired as e:  # what the page and its servers said so far
        said = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        logs = "".join(
            f"\n--- {log.relative_to(work)}\n{log.read_text(errors='replace')[-3000:]}"
            for log in sorted(work.rglob("*.log"))
        )
        said = (said or "")[-4000:]
        pytest.fail(f"{page_id(page)} ran past {e.timeout:.0f} s:\n{said}{logs[-12000:]}")
    # kept beside the page's script: each block's header says when into the page it began
    (work / "page.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, f"{page_id(page)}:\n{done.stdout[-6000:]}\n{done.stderr[-4000:]}"


def env_model(env: dict) -> Path:
    cache = Path(env["HF_HUB_CACHE"])
    return next((cache / f"models--{HUB_ID.replace('/', '--')}" / "snapshots").iterdir())
