"""Python's keywords against dsrt's option tables (dsrt.options()).

Datastore and Pipeline take every keyword the tables say applies to them, under
the tools' name with '-' as '_', with the same default as the tables state
(their signatures in the docstrings are what users read), and refuse a bad
name with the tools' message, "did you mean" included.
"""
import ast
import os
import re
import struct
import warnings

import pytest

import dsrt


def signature_defaults(cls):
    """{keyword: default text} from the first paragraph of cls.__doc__."""
    head = cls.__doc__.split("\n\n", 1)[0]
    inner = head[head.index("(") + 1:head.rindex(")")]
    found = {}
    for part in re.split(r",\s*", " ".join(inner.split())):
        part = part.strip()
        if part in ("*", "") or "=" not in part:
            found[part] = None
            continue
        k, v = part.split("=", 1)
        found[k.strip()] = v.strip()
    return found


SIZE = re.compile(r"^(\d+)\s*([KMGT])(iB)?$")


def same_default(doc, table):
    """The docstring's default (Python text) equals the table's (tool text);
    sizes as "64 MiB" and "64M" alike."""
    sizes = [SIZE.match(t) for t in (doc, table)]
    if all(sizes):
        return sizes[0].group(1, 2) == sizes[1].group(1, 2)
    try:
        value = ast.literal_eval(doc)
    except (ValueError, SyntaxError):
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(table) == float(value)
        except ValueError:
            return False
    return str(value) == table


@pytest.mark.parametrize("cls,place", [(dsrt.Datastore, "Datastore"), (dsrt.Pipeline, "Pipeline")])
def test_keywords_and_defaults_agree(cls, place):
    sig = signature_defaults(cls)
    rows = [r for r in dsrt.options() if place in r["where"]]
    assert rows
    problems = []
    for r in rows:
        if r["name"] not in sig:
            problems.append(f"{r['name']}: in the table for {place}, not in its signature")
            continue
        doc = sig[r["name"]]
        # None is "not given", which the table's default then says.
        if doc is None or doc == "None" or r["default"] is None:
            continue
        if not same_default(doc, r["default"]):
            problems.append(f"{r['name']}: {place} says {doc}, the table {r['default']}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("cls,place", [(dsrt.Datastore, "Datastore"), (dsrt.Pipeline, "Pipeline")])
def test_every_keyword_has_a_row(cls, place):
    """No keyword outside the tables: each has its row, whose help and
    default the tools and the docs share."""
    positional = {"Datastore": "path", "Pipeline": "datastore"}[place]
    names = {r["name"] for r in dsrt.options() if place in r["where"]}
    missing = [k for k in signature_defaults(cls) if k not in names and k not in ("*", positional)]
    assert not missing, f"{place} keywords without a row in dsrt's option tables: {missing}"


def test_positive_keywords_of_negating_flags():
    """A tool's negating flag is a positive keyword in Python, True by default."""
    rows = {r["option"]: r for r in dsrt.options() if r["where"] != ["dsbench convert"]}
    assert rows["no-subfolders"]["name"] == "include_subfolders"
    assert rows["no-follow"]["name"] == "follow_symlinks"
    assert rows["no-pin"]["name"] == "pin"
    assert signature_defaults(dsrt.Datastore)["follow_symlinks"] == "True"
    assert signature_defaults(dsrt.Pipeline)["pin"] == "True"


def test_rows_are_well_formed():
    for r in dsrt.options():
        negating = r["option"].startswith("no-") and r["type"] == "flag"
        assert r["name"] == r["option"].replace("-", "_") or negating or r["option"] == "coarse"
        assert r["help"] and r["where"]
        if r["type"] == "choice":
            assert r["choices"]


@pytest.fixture
def idx(tmp_path):
    """A Datastore over four 8 x 8 gray images in an IDX file."""
    images = os.path.join(tmp_path, "train-images-idx3-ubyte")
    with open(images, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, 4, 8, 8) + bytes(4 * 64))
    with open(os.path.join(tmp_path, "train-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, 4) + bytes([0, 1, 0, 1]))
    return dsrt.Datastore(images)


def test_choice_messages_match_the_tools(idx):
    with pytest.raises(ValueError, match=r"shuffle: 'every_epoch' is not never, once or "
                                         r"every-epoch \(did you mean every-epoch\?\)"):
        dsrt.Pipeline(idx, shuffle="every_epoch")
    with pytest.raises(ValueError, match=r"preset: 'imagenet2' is not .*did you mean imagenet\?"):
        dsrt.Pipeline(idx, preset="imagenet2")


def test_older_shuffle_name_warns(idx):
    with pytest.warns(DeprecationWarning, match="shuffle='epoch' is now 'every-epoch'"):
        with dsrt.Pipeline(idx, shuffle="epoch", batch=2, epochs=1) as p:
            assert sum(b.count for b in p) == 4


class _Doc:
    """Net.load's docstring where signature_defaults looks for a class's."""
    def __init__(self, doc):
        self.__doc__ = doc


def test_net_load_keywords_have_rows():
    """Net.load's keywords against the rows that say 'Net': the same names,
    defaults and messages as dstrain classify's options."""
    sig = signature_defaults(_Doc(dsrt.Net.load.__doc__))
    rows = {r["name"]: r for r in dsrt.Net.options() if "Net" in r["where"]}
    missing = [k for k in sig if k not in rows and k not in ("*", "path")]
    assert not missing, f"Net.load keywords without a row: {missing}"
    assert set(rows) <= set(sig), f"rows for Net that Net.load lacks: {set(rows) - set(sig)}"
    for name, doc in sig.items():
        r = rows.get(name)
        if r and doc not in (None, "None") and r["default"] is not None:
            assert same_default(doc, r["default"]), f"{name}: Net.load {doc}, the table {r['default']}"
    with pytest.raises(ValueError, match=r"size_mode: 'centercop' is not resize or centercrop "
                                         r"\(did you mean centercrop\?\)"):
        dsrt.Net.load("unused.onnx", size_mode="centercop")
    with pytest.raises(ValueError, match=r"preprocess: 'torchvison' .*did you mean torchvision\?"):
        dsrt.Net.load("unused.onnx", preprocess="torchvison")
    with pytest.raises(ValueError, match=r"resize_shorter: 70000: not in \[0, 65535\]"):
        dsrt.Net.load("unused.onnx", resize_shorter=70000)
