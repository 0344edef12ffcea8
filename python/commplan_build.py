"""The package's build backend (PEP 517, standard library only): `pip install ./python` builds a
wheel here with nothing to download -- no setuptools or wheel package needed, so it installs
offline, build isolation or not.

The wheel holds the commplan package and, as commplan/_root/, the repository's generator: gen/
(its Lua files), templates/, VERSION and docs/plan-json.schema.json, what gen/commplan.lua reads
beside itself. So the installed `commplan` command runs the generator it was built with, wherever
it is installed, without the checkout (commplan/generator.py: where the generator is found). An
editable install (pip install -e ./python) points at this checkout instead, generator included.
Metadata, the `commplan` console script and the version are pyproject.toml's.
"""

import base64
import hashlib
import os
import re
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# What gen/commplan.lua reads beside itself (package.path, templates, --version, gen/plandiff.lua).
ROOT_DIRS = ("gen", "templates")
ROOT_FILES = ("VERSION", "docs/plan-json.schema.json")


def _project():
    """name, version, description, requires-python, dependencies, optional deps, scripts from pyproject.toml."""
    text = open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8").read()
    try:
        import tomllib
        doc = tomllib.loads(text)
    except ImportError:  # Python < 3.11: the few plain lines this file has
        doc, sec = {}, None
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            m = re.fullmatch(r"\[([\w.-]+)\]", line)
            if m:
                sec = doc
                for part in m.group(1).split("."):
                    sec = sec.setdefault(part, {})
                continue
            m = re.fullmatch(r'([\w-]+)\s*=\s*(.*)', line)
            if m and sec is not None:
                v = m.group(2)
                sec[m.group(1)] = re.findall(r'"([^"]*)"', v) if v.startswith("[") else v.strip('"')
    return doc["project"]


def _metadata(p):
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % p["version"]]
    if p.get("description"):
        lines.append("Summary: %s" % p["description"])
    if p.get("requires-python"):
        lines.append("Requires-Python: %s" % p["requires-python"])
    for d in p.get("dependencies", []):
        lines.append("Requires-Dist: %s" % d)
    for extra, deps in sorted(p.get("optional-dependencies", {}).items()):
        lines.append("Provides-Extra: %s" % extra)
        for d in deps:
            lines.append("Requires-Dist: %s ; extra == \"%s\"" % (d, extra))
    return "\n".join(lines) + "\n"


def _entry_points(p):
    scripts = p.get("scripts", {})
    if not scripts:
        return None
    return "[console_scripts]\n" + "".join("%s = %s\n" % kv for kv in sorted(scripts.items()))


def _package_files():
    """(archive name, bytes) of the package and the generator, in a fixed order."""
    out = []
    pkg = os.path.join(HERE, "commplan")
    for f in sorted(os.listdir(pkg)):
        if f.endswith(".py"):
            out.append(("commplan/" + f, open(os.path.join(pkg, f), "rb").read()))
    missing = [p for p in ROOT_DIRS + ROOT_FILES if not os.path.exists(os.path.join(REPO, p))]
    if missing:
        raise SystemExit("commplan: %s not found beside python/; build the package from a commplan checkout "
                         "(pip install ./python)" % ", ".join(missing))
    for d in ROOT_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(REPO, d)):
            dirnames[:] = sorted(x for x in dirnames if not x.startswith(".") and x != "__pycache__")
            for f in sorted(filenames):
                if f.startswith(".") or f.endswith(".tmp"):
                    continue
                full = os.path.join(dirpath, f)
                rel = os.path.relpath(full, REPO).replace(os.sep, "/")
                out.append(("commplan/_root/" + rel, open(full, "rb").read()))
    for f in ROOT_FILES:
        out.append(("commplan/_root/" + f, open(os.path.join(REPO, f), "rb").read()))
    return out


def _wheel(wheel_directory, files):
    p = _project()
    name, version = p["name"], p["version"]
    info = "%s-%s.dist-info" % (name, version)
    files = list(files) + [(info + "/METADATA", _metadata(p).encode()),
                           (info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: commplan_build\nRoot-Is-Purelib: true\n"
                                             b"Tag: py3-none-any\n")]
    ep = _entry_points(p)
    if ep:
        files.append((info + "/entry_points.txt", ep.encode()))
    record = []
    whl = "%s-%s-py3-none-any.whl" % (name, version)
    with zipfile.ZipFile(os.path.join(wheel_directory, whl), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            z.writestr(zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0)), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
        record.append(info + "/RECORD,,")
        z.writestr(zipfile.ZipInfo(info + "/RECORD", date_time=(1980, 1, 1, 0, 0, 0)), "\n".join(record) + "\n")
    return whl


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # the package and its generator from this checkout: a .pth naming python/
    return _wheel(wheel_directory, [("commplan_editable.pth", (HERE + "\n").encode())])
