"""A small reader of launch scripts as users keep them (bash): the words of the launch command
after the script's own assignments, arrays and ``${VAR:-default}`` expansions, as bash would
expand them.

What is understood (the subset Megatron-LM's ``examples/*.sh`` use): ``NAME=value``,
``export NAME=value``, arrays ``NAME=( ... )`` and ``NAME+=( ... )``, ``$NAME``, ``${NAME}``,
``${NAME:-default}`` / ``${NAME-default}`` / ``${NAME:=default}``, ``${NAME[@]}``, positional
``$1`` .. ``${9:-default}``, ``$((arithmetic))``, single and double quotes, backslash escapes and
line continuations, comments, and ``if [[ ... ]]; then ... elif ... else ... fi`` with the tests
``-z``, ``-n``, ``==``, ``=``, ``!=``, ``-eq`` .. ``-ge``, ``!``, ``||``, ``&&``. Loops, ``case``,
functions and ``source`` are skipped (noted); file tests are undecided and taken as false (noted).
A value the script takes from the environment or from its own arguments comes from ``env``
(the CLI's ``--env NAME=VALUE``) or stays as written (``${NAME}``), so the reader of that flag can
name what to pass.

The launch command is the last command that runs ``torchrun`` / ``torch.distributed.run`` /
a ``*.py`` script; text without one (an argument block) is read whole.

Only ``env`` is read, never this process's environment: a script's ``$OPENAI_API_KEY`` stays
``${OPENAI_API_KEY}`` (a name), so no secret of the shell tune-cp runs in reaches a message or an
export.

Every expansion is bounded (a one-line ConfigError naming the limit, where bash would run out of
memory or time): nesting of ``${...}`` defaults, quotes and ``if`` blocks
(:data:`MAX_SHELL_DEPTH`), the characters all expansions produce together
(:data:`MAX_EXPANDED_CHARS`: ``A="$A$A"`` doubling), the text itself
(:data:`MAX_SCRIPT_CHARS`), arithmetic (:data:`MAX_ARITH_CHARS`
characters, 64-bit integers as in bash, whose wrap-around is refused rather than imitated) and
the wall-clock time of the whole reading (:data:`MAX_SHELL_SECONDS`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from tune_cp.config.specs import ConfigError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)", re.S)
OPERATORS = ("&&", "||", ";;", "|&", ";", "|", "&", "(", ")", "<", ">")
COMMAND_END = frozenset({";", "&&", "||", "|", "&", "|&", ";;", "\n"})
LAUNCHERS = frozenset({"torchrun", "torch.distributed.run", "torch.distributed.launch"})
NOT_LAUNCH = frozenset({"echo", "printf", "cat", "mkdir", "test", "[", "[[", "ls", "cd", "rm"})
# A backslash followed by blanks and more text on the same line: a continuation whose newline
# was lost in a copy (a web page, a chat message). Outside quotes only (checked by the lexer).
LOST_CONTINUATION = re.compile(r"\\[ \t]+(?=\S)")
SKIPPED_BLOCKS = {"while": "done", "until": "done", "for": "done", "select": "done",
                  "case": "esac"}
INT_EXPR = re.compile(r"[\d\s+\-*/%()]+")
UNSET = "\0"  # marker in a word for an expansion the script leaves to its caller

#: Deepest nesting of ``${A:-${B:-...}}`` defaults, quotes inside expansions and ``if`` blocks
#: (real launch scripts nest two or three deep).
MAX_SHELL_DEPTH = 64
#: Longest launch text read (1 MiB; Megatron-LM's longest example script is about 10 KiB).
MAX_SCRIPT_CHARS = 2**20
#: Most characters all expansions of one script produce together, each field counting one more
#: (its separator): four times the longest script; ``A="$A$A"`` 30 times would be 1 GiB.
MAX_EXPANDED_CHARS = 4 * MAX_SCRIPT_CHARS
#: Longest ``$((...))`` expression evaluated, after its variables are substituted.
MAX_ARITH_CHARS = 4096
#: bash arithmetic is signed 64-bit (``intmax_t``); a result outside it is refused.
ARITH_MAX = 2**63 - 1
#: Longest a launch script's reading may take (wall clock); a real one takes milliseconds.
MAX_SHELL_SECONDS = 10.0


class ShellError(ConfigError):
    """A launch text the reader refuses (a bound of the module docstring, an unclosed quote);
    the CLI names the option or file it came from."""


@dataclass
class Word:
    """A raw word as written (quotes kept) or an operator / newline."""

    text: str
    op: bool = False


@dataclass
class Script:
    """The expanded launch: its words, the variables it left to the caller, and notes."""

    words: list[str]
    unset: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    is_script: bool = False


# ------------------------------------------------------------------------------------ lexing


def _lex(text: str, notes: list[str]) -> list[Word]:
    """Raw words and operators; ``\\n`` ends a command (inside ``( )`` it separates elements)."""
    out: list[Word] = []
    i, n = 0, len(text)
    cur: list[str] = []
    lost = False

    def flush() -> None:
        if cur:
            out.append(Word("".join(cur)))
            cur.clear()

    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            if text[i + 1] == "\n":
                i += 2
                continue
            if text[i + 1] in " \t" and LOST_CONTINUATION.match(text, i):
                m = LOST_CONTINUATION.match(text, i)
                assert m is not None
                lost = True
                flush()
                i = m.end()
                continue
            cur.append(text[i:i + 2])
            i += 2
            continue
        if c in " \t\r":
            flush()
            i += 1
            continue
        if c == "\n":
            flush()
            out.append(Word("\n", op=True))
            i += 1
            continue
        if c == "#" and not cur:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c in "'\"":
            j = _close_quote(text, i)
            cur.append(text[i:j])
            i = j
            continue
        if c == "$" and i + 1 < n and text[i + 1] in "({":
            j = _close_dollar(text, i, dq=False)
            cur.append(text[i:j])
            i = j
            continue
        if c == "`":
            j = text.find("`", i + 1)
            j = n if j < 0 else j + 1
            cur.append(text[i:j])
            i = j
            continue
        if c == "(" and cur and cur[-1].endswith("="):  # NAME=( array
            flush()
            out.append(Word("(", op=True))
            i += 1
            continue
        op = next((o for o in OPERATORS if text.startswith(o, i)), None)
        if op is not None:
            flush()
            out.append(Word(op, op=True))
            i += len(op)
            continue
        cur.append(c)
        i += 1
    flush()
    if lost:
        notes.append("a backslash followed by more text on the same line was read as a line "
                     "continuation whose newline was lost (a pasted block); check the flags "
                     "after it are the ones you meant")
    return out


def _too_deep(what: str) -> ConfigError:
    """``what`` is the construct that went one level too deep."""
    return ShellError(f"the launch text nests {what} more than {MAX_SHELL_DEPTH} deep "
                       f"(MAX_SHELL_DEPTH: expansions, quotes and if blocks together); write the "
                       f"values out")


def _close_quote(text: str, i: int, depth: int = 0) -> int:
    """End of the quoted string starting at ``i``."""
    if depth > MAX_SHELL_DEPTH:
        raise _too_deep("quotes and expansions")
    q = text[i]
    j = i + 1
    while j < len(text):
        if q == '"' and text[j] == "\\":
            j += 2
            continue
        if q == '"' and text[j] == "$" and j + 1 < len(text) and text[j + 1] in "({":
            j = _close_dollar(text, j, dq=True, depth=depth + 1)
            continue
        if text[j] == q:
            return j + 1
        j += 1
    raise ShellError(f"the launch text has an unclosed {q} quote; check the quotes")


def _close_dollar(text: str, i: int, dq: bool, depth: int = 0) -> int:
    """End of ``${...}`` / ``$(...)`` / ``$((...))`` starting at ``i`` (nesting respected).
    Quotes inside are skipped whole (bash: ``${A:-"}"}`` is ``}``); inside double quotes
    (``dq``) a single quote in ``${...}`` is a plain character (``"${A:-it's}"``)."""
    if depth > MAX_SHELL_DEPTH:
        raise _too_deep("quotes and expansions")
    open_ch = text[i + 1]
    close_ch = "}" if open_ch == "{" else ")"
    depth_here, j = 0, i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"' or (c == "'" and (open_ch == "(" or not dq)):
            j = _close_quote(text, j, depth + 1)
            continue
        if c == "$" and j + 1 < len(text) and text[j + 1] in "({" and j > i + 1:
            j = _close_dollar(text, j, dq, depth + 1)
            continue
        if c == open_ch:
            depth_here += 1
        elif c == close_ch:
            depth_here -= 1
            if depth_here == 0:
                return j + 1
        j += 1
    raise ShellError(f"the launch text has an unclosed {text[i:i + 2]}; check the brackets")


# ---------------------------------------------------------------------------------- expansion


class _Shell:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.scalars: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}
        self.unset: list[str] = []
        self.notes: list[str] = []
        self.launches: list[list[str]] = []
        self.commands: list[list[str]] = []
        self.depth = 0  # nesting of expansions and if blocks now (MAX_SHELL_DEPTH)
        self.produced = 0  # characters expanded so far (MAX_EXPANDED_CHARS)
        self.deadline = time.monotonic() + MAX_SHELL_SECONDS

    # ---- bounds
    def enter(self, what: str) -> None:
        """One level deeper (an expansion inside an expansion, an ``if`` inside an ``if``);
        refused past :data:`MAX_SHELL_DEPTH`, and past :data:`MAX_SHELL_SECONDS`."""
        self.depth += 1
        if self.depth > MAX_SHELL_DEPTH:
            raise _too_deep(what)
        self.on_time()

    def leave(self) -> None:
        self.depth -= 1

    def on_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise ShellError(f"reading the launch script took more than {MAX_SHELL_SECONDS:g} s "
                              f"(MAX_SHELL_SECONDS); paste the expanded command (for example "
                              f"from the launch log)")

    def spend(self, chars: int) -> None:
        """Count ``chars`` expanded characters; refused past :data:`MAX_EXPANDED_CHARS`."""
        self.produced += chars
        if self.produced > MAX_EXPANDED_CHARS:
            raise ShellError(f"the launch script's expansions produce more than "
                              f"{MAX_EXPANDED_CHARS:,} characters (MAX_EXPANDED_CHARS; a "
                              f"variable that doubles itself, A=\"$A$A\"?); write the values out")

    # ---- values
    def lookup(self, name: str) -> str | None:
        if name in self.arrays:
            return self.arrays[name][0] if self.arrays[name] else ""
        if name in self.scalars:
            return self.scalars[name]
        if name in self.env:
            return self.env[name]
        if name == "#":
            return "0"
        return None

    def param(self, body: str, dq: bool = False) -> list[str] | str:
        """``${body}``: a string, or a list of fields for ``NAME[@]`` (``dq``: inside double
        quotes, where a default's single quotes are plain characters)."""
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]", body)
        if m:
            name = m.group(1)
            if name in self.arrays:
                return list(self.arrays[name])
            value = self.lookup(name)
            return [] if value is None else [value]
        m = re.fullmatch(r"#([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]", body)
        if m:
            return str(len(self.arrays.get(m.group(1), [])))
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|\d+|[#@*])(?:(:?)([-=+?])(.*))?", body, re.S)
        if not m:
            self.note(f"${{{body}}} is not an expansion tune-cp reads; left as written")
            return UNSET + "${" + body + "}"
        name, colon, kind, alt = m.groups()
        value = self.lookup(name) if not name.isdigit() else self.env.get(name)
        empty = value is None or (colon and value == "")
        if kind in ("-", "="):
            if empty:
                value = self.expand_string(alt or "", dq)
                if kind == "=" and not name.isdigit():
                    self.scalars[name] = value
            return value
        if kind == "+":
            return "" if empty else self.expand_string(alt or "", dq)
        if value is None:
            if name in "@*":
                return []
            self._unset(name)
            return UNSET + "${" + name + "}"
        return value

    def _unset(self, name: str) -> None:
        if name not in self.unset:
            self.unset.append(name)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def arith(self, expr: str) -> str:
        """``$((expr))`` in bash's 64-bit integers (``+ - * / % **``, parentheses; ``$NAME``
        substituted as text, a bare ``NAME`` as its value in parentheses); anything else, an
        unset variable or a division by zero is left as written."""
        text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                      lambda m: self.lookup(m.group(1)) or "", expr)
        text = re.sub(r"\b([A-Za-z_][A-Za-z0-9_]*)\b",
                      lambda m: f"({self.lookup(m.group(1)) or ''})", text)
        if len(text) > MAX_ARITH_CHARS:
            raise ShellError(f"the launch script's arithmetic $(({_shown(expr)})) is "
                              f"{len(text):,} characters once expanded; at most "
                              f"{MAX_ARITH_CHARS:,} are evaluated (MAX_ARITH_CHARS)")
        if not text.strip() or not INT_EXPR.fullmatch(text):
            return UNSET + "$((" + expr + "))"
        try:
            value = _Arith(text).value()
        except _ArithOverflow:
            raise ShellError(f"the launch script's arithmetic $(({_shown(expr)})) leaves 64-bit "
                              f"integers (|n| <= 2**63 - 1: ARITH_MAX; bash would wrap around); "
                              f"write the value out") from None
        except (SyntaxError, ZeroDivisionError):
            return UNSET + "$((" + expr + "))"
        return str(value)

    def expand_string(self, text: str, dq: bool = False) -> str:
        """Expansion without field splitting (assignment values, defaults)."""
        fields = self.expand(text, split=False, dq=dq)
        return " ".join(fields)

    def expand(self, raw: str, split: bool = True, dq: bool = False) -> list[str]:
        """Fields of one raw word as bash gives them (quote removal, unquoted results split);
        ``dq``: the word starts inside double quotes (a default inside ``"${...}"``)."""
        self.enter("${...} expansions")
        try:
            fields = self._expand(raw, split, dq)
        finally:
            self.leave()
        self.spend(sum(len(f) + 1 for f in fields))
        return fields

    def _expand(self, raw: str, split: bool, dq: bool) -> list[str]:
        fields: list[str] = []
        cur: list[str] = []
        have = False  # whether the current field exists (a quoted empty string makes one)
        i, n = 0, len(raw)

        def add_unquoted(value: str | list[str]) -> None:
            nonlocal have
            parts = value if isinstance(value, list) else (
                value.split() if split else [value])
            if isinstance(value, list) and split:
                parts = [p for v in value for p in v.split()]
            if not parts:
                return
            if isinstance(value, str) and split and value[:1].isspace() and cur:
                end_field()
            for k, part in enumerate(parts):
                if k:
                    end_field()
                cur.append(part)
                have = True

        def end_field() -> None:
            nonlocal have
            if have:
                fields.append("".join(cur))
            cur.clear()
            have = False

        while i < n:
            c = raw[i]
            if c == "'" and not dq:
                j = raw.find("'", i + 1)
                if j < 0:
                    raise ShellError(f"the launch text has an unclosed ' quote in "
                                      f"{_shown(raw)}; check the quotes")
                cur.append(raw[i + 1:j])
                have = True
                i = j + 1
                continue
            if c == '"':
                dq = not dq
                have = True
                i += 1
                continue
            if c == "\\" and i + 1 < n:
                nxt = raw[i + 1]
                if nxt == "\n":  # a line continuation, also inside double quotes
                    i += 2
                    continue
                if not dq or nxt in '$`"\\':
                    cur.append(nxt)
                else:
                    cur.append(c + nxt)
                have = True
                i += 2
                continue
            if c == "$" and i + 1 < n:
                value, j = self._dollar(raw, i, dq)
                if value is None:
                    cur.append("$")
                    have = True
                    i += 1
                    continue
                if dq:
                    if isinstance(value, list):
                        for k, v in enumerate(value):
                            if k:
                                end_field()
                            cur.append(v)
                            have = True
                    else:
                        cur.append(value)
                        have = True
                else:
                    add_unquoted(value)
                i = j
                continue
            if c == "`":
                j = raw.find("`", i + 1)
                j = n if j < 0 else j + 1
                self.note(f"command substitution {raw[i:j]} is not run; left as written")
                cur.append(UNSET + raw[i:j])
                have = True
                i = j
                continue
            cur.append(c)
            have = True
            i += 1
        end_field()
        return fields

    def _dollar(self, raw: str, i: int, dq: bool) -> tuple[str | list[str] | None, int]:
        nxt = raw[i + 1]
        if raw.startswith("$((", i):
            j = _close_dollar(raw, i, dq)
            return self.arith(raw[i + 3:j - 2]), j
        if nxt == "(":
            j = _close_dollar(raw, i, dq)
            self.note(f"command substitution {_shown(raw[i:j])} is not run; left as written")
            return UNSET + raw[i:j], j
        if nxt == "{":
            j = _close_dollar(raw, i, dq)
            return self.param(raw[i + 2:j - 1], dq), j
        m = NAME.match(raw, i + 1)
        if m:
            return self.param(m.group(0)), m.end()
        if nxt.isdigit() or nxt in "#@*":
            return self.param(nxt), i + 2
        return None, i + 1

    # ---- statements
    def run(self, words: list[Word]) -> None:
        i = 0
        while i < len(words):
            self.on_time()
            i = self.statement(words, i)

    def statement(self, words: list[Word], i: int) -> int:
        """Run the statement starting at ``i``; the index after it."""
        while i < len(words) and words[i].op and words[i].text in COMMAND_END:
            i += 1
        if i >= len(words):
            return i
        head = words[i].text if not words[i].op else ""
        if head == "if":
            return self.if_block(words, i)
        if head in SKIPPED_BLOCKS:
            end = _matching(words, i, head, SKIPPED_BLOCKS[head])
            self.note(f"a {head} block of the script is not run (tune-cp reads straight-line "
                      "scripts)")
            return end
        if head == "function" or (NAME.fullmatch(head) and i + 2 < len(words) and
                                  words[i + 1].text == "(" and
                                  words[i + 2].text == ")"):
            return _skip_function(words, i)
        if head in ("exit", "return"):
            return len(words)
        if head in ("export", "local", "declare", "readonly"):
            i += 1
            while i < len(words) and not words[i].op and words[i].text.startswith("-"):
                i += 1
        # a simple command: assignments, then words, up to a command end
        j = i
        assigned = False
        while j < len(words) and not (words[j].op and words[j].text in COMMAND_END):
            w = words[j]
            if w.op and w.text == "(":  # stray array start
                j += 1
                continue
            m = ASSIGN.fullmatch(w.text) if not w.op else None
            if m and (j == i or assigned or words[j - 1].text in ("export", "local", "declare",
                                                                  "readonly")):
                j = self.assign(words, j, m)
                assigned = True
                continue
            break
        start = j
        while j < len(words) and not (words[j].op and words[j].text in COMMAND_END):
            j += 1
        cmd = [w for w in words[start:j] if not w.op or w.text not in ("<", ">")]
        fields: list[str] = []
        for w in cmd:
            fields.extend([w.text] if w.op else self.expand(w.text))
        if fields and fields[0] in ("export", "local", "declare", "readonly", "set", "unset"):
            return j
        if fields and fields[0] in ("source", "."):
            self.note(f"`{' '.join(fields)}` is not read; pass what it sets with --env")
            return j
        if fields:
            self.commands.append(fields)
            if fields[0] not in NOT_LAUNCH and any(
                f in LAUNCHERS or f.endswith(".py") for f in fields
            ):
                self.launches.append(fields)
        return j

    def assign(self, words: list[Word], j: int, m: re.Match[str]) -> int:
        name, plus, value = m.groups()
        if value == "" and j + 1 < len(words) and words[j + 1].op and words[j + 1].text == "(":
            k = j + 2
            items: list[str] = []
            while k < len(words) and not (words[k].op and words[k].text == ")"):
                if not words[k].op:
                    items.extend(self.expand(words[k].text))
                k += 1
            if plus:
                self.arrays[name] = [*self.arrays.get(name, []), *items]
            else:
                self.arrays[name] = items
                self.scalars.pop(name, None)
            return k + 1
        text = self.expand_string(value) if value else ""
        if plus and name in self.arrays:
            self.arrays[name].append(text)
        else:
            if plus:  # NAME+=text builds a new value: it counts whole (A+=x 100,000 times)
                text = self.scalars.get(name, "") + text
                self.spend(len(text))
            self.scalars[name] = text
            self.arrays.pop(name, None)
        return j + 1

    def if_block(self, words: list[Word], i: int) -> int:
        """``if COND; then BODY [elif COND; then BODY]... [else BODY] fi``."""
        end = _matching(words, i, "if", "fi")
        branches: list[tuple[list[Word] | None, list[Word]]] = []
        depth, k, part_start, cond = 0, i + 1, i + 1, None
        kind = "cond"
        while k < end - 1:
            w = words[k]
            at_start = k == 0 or (words[k - 1].op and words[k - 1].text in COMMAND_END)
            if not w.op and at_start:
                if w.text in ("if", *SKIPPED_BLOCKS):
                    depth += 1
                elif w.text in ("fi", "done", "esac"):
                    depth -= 1
                elif depth == 0 and w.text == "then" and kind == "cond":
                    cond = words[part_start:k]
                    part_start, kind = k + 1, "body"
                elif depth == 0 and w.text in ("elif", "else") and kind == "body":
                    branches.append((cond, words[part_start:k]))
                    cond = None
                    part_start, kind = k + 1, "cond" if w.text == "elif" else "else"
            k += 1
        branches.append((cond if kind == "body" else None, words[part_start:end - 1]))
        self.enter("if blocks")
        try:
            for cond_words, body in branches:
                if cond_words is None or self.condition(cond_words):
                    self.run(body)
                    break
        finally:
            self.leave()
        return end

    def condition(self, words: list[Word]) -> bool:
        """A list of tests joined by ``||`` / ``&&`` (left to right); undecided tests are false."""
        result: bool | None = None
        joiner = None
        test: list[Word] = []
        for w in [*words, Word(";", op=True)]:
            if w.op and w.text in ("||", "&&", ";", "\n"):
                if test:
                    value = self.test(test)
                    if result is None:
                        result = value
                    elif joiner == "||":
                        result = result or value
                    else:
                        result = result and value
                    test = []
                if w.text in ("||", "&&"):
                    joiner = w.text
                continue
            test.append(w)
        return bool(result)

    def test(self, words: list[Word]) -> bool:
        fields: list[str] = []
        for w in words:
            if w.op:
                fields.append(w.text)
                continue
            expanded = self.expand(w.text, split=False)
            fields.append(expanded[0] if expanded else "")
        shown = " ".join(w.text for w in words)
        if fields and fields[0] in ("[[", "[", "test"):
            fields = fields[1:]
            if fields and fields[-1] in ("]]", "]"):
                fields = fields[:-1]
        else:
            self.note(f"the condition `{shown}` runs a command; taken as false")
            return False
        negate = False
        while fields and fields[0] == "!":
            negate, fields = not negate, fields[1:]
        value = self._decide(fields)
        if value is None:
            self.note(f"the condition `{shown}` cannot be decided here; taken as false")
            return False
        return value != negate

    @staticmethod
    def _decide(f: list[str]) -> bool | None:
        f = [x.replace(UNSET, "") if UNSET in x else x for x in f]
        if any(x.startswith("${") or x.startswith("$(") for x in f):
            return None
        if len(f) == 2 and f[0] in ("-z", "-n"):
            return (f[1] == "") == (f[0] == "-z")
        if len(f) == 1:
            return f[0] != ""
        if len(f) == 3:
            a, op, b = f
            if op in ("==", "="):
                return a == b
            if op == "!=":
                return a != b
            ops = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__,
                   "-gt": int.__gt__, "-ge": int.__ge__}
            if op in ops and re.fullmatch(r"-?\d+", a) and re.fullmatch(r"-?\d+", b):
                return ops[op](int(a), int(b))
        return None


def _shown(text: str, limit: int = 60) -> str:
    """A piece of the script for a message: one line, cut at ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _ArithOverflow(Exception):
    """An arithmetic result outside bash's 64-bit integers."""


class _Arith:
    """bash arithmetic over ``+ - * / % **`` and parentheses in 64-bit integers: ``**`` binds
    tightest and to the right, unary signs next, then ``* / %``, then ``+ -``; division and
    remainder truncate toward zero (C, as bash). A result beyond :data:`ARITH_MAX` is
    :class:`_ArithOverflow` (bash wraps; a reader refuses), an exponent below zero or a
    malformed expression a SyntaxError. Parentheses nest at most :data:`MAX_SHELL_DEPTH`."""

    TOKEN = re.compile(r"\s*(?:(\d+)|(\*\*|[-+*/%()]))")

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = self.TOKEN.match(text, pos)
            if not m:
                raise SyntaxError(text)
            self.tokens.append(m.group(1) or m.group(2))
            pos = m.end()
        self.i = 0
        self.depth = 0

    def value(self) -> int:
        v = self.sum()
        if self.i != len(self.tokens):
            raise SyntaxError("trailing tokens")
        return v

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        if self.i >= len(self.tokens):
            raise SyntaxError("unexpected end")
        self.i += 1
        return self.tokens[self.i - 1]

    @staticmethod
    def check(v: int) -> int:
        if abs(v) > ARITH_MAX:
            raise _ArithOverflow
        return v

    def sum(self) -> int:
        v = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            r = self.product()
            v = self.check(v + r if op == "+" else v - r)
        return v

    def product(self) -> int:
        v = self.unary()
        while self.peek() in ("*", "/", "%"):
            op = self.take()
            r = self.unary()
            if op == "*":
                v = self.check(v * r)
            else:
                if r == 0:
                    raise ZeroDivisionError
                q = abs(v) // abs(r) * (1 if (v >= 0) == (r >= 0) else -1)
                v = self.check(q if op == "/" else v - q * r)
        return v

    def unary(self) -> int:
        if self.peek() in ("+", "-"):
            op = self.take()
            self.depth += 1
            if self.depth > MAX_SHELL_DEPTH:
                raise _too_deep("arithmetic signs and parentheses")
            v = self.unary()
            self.depth -= 1
            return -v if op == "-" else v
        return self.power()

    def power(self) -> int:
        base = self.atom()
        if self.peek() != "**":
            return base
        self.take()
        exp = self.unary()  # right-associative, and 2**-1 parses (then is refused)
        if exp < 0:
            raise SyntaxError("exponent less than 0")
        if abs(base) > 1 and exp > 63:
            raise _ArithOverflow
        return self.check(base ** exp)

    def atom(self) -> int:
        tok = self.take()
        if tok == "(":
            self.depth += 1
            if self.depth > MAX_SHELL_DEPTH:
                raise _too_deep("arithmetic signs and parentheses")
            v = self.sum()
            self.depth -= 1
            if self.take() != ")":
                raise SyntaxError("unclosed (")
            return v
        if not tok.isdigit():
            raise SyntaxError(tok)
        if len(tok) > 19:
            raise _ArithOverflow
        return self.check(int(tok))


def _matching(words: list[Word], i: int, opener: str, closer: str) -> int:
    """Index after the ``closer`` that ends the block opened at ``i``."""
    depth = 0
    for k in range(i, len(words)):
        w = words[k]
        at_start = k == i or (words[k - 1].op and words[k - 1].text in COMMAND_END) or \
            words[k - 1].text in ("then", "else", "do")
        if w.op or not at_start:
            continue
        if w.text in (opener, *(o for o, c in SKIPPED_BLOCKS.items() if c == closer)):
            depth += 1
        elif w.text == closer:
            depth -= 1
            if depth == 0:
                return k + 1
    raise ShellError(f"the launch script has a {opener} without its {closer}; check the script")


def _skip_function(words: list[Word], i: int) -> int:
    depth = 0
    for k in range(i, len(words)):
        if not words[k].op and words[k].text == "{":
            depth += 1
        elif not words[k].op and words[k].text == "}":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(words)


def expand_launch(text: str, env: Mapping[str, str] | None = None) -> Script:
    """The words of the launch in ``text`` (see the module docstring)."""
    if len(text) > MAX_SCRIPT_CHARS:
        raise ShellError(f"the launch text is {len(text):,} characters; at most "
                          f"{MAX_SCRIPT_CHARS:,} are read (MAX_SCRIPT_CHARS); give the launch "
                          f"script itself or its argument block")
    notes: list[str] = []
    words = _lex(text, notes)
    shell = _Shell(env or {})
    shell.notes = notes
    shell.run(words)
    is_script = bool(shell.scalars or shell.arrays)
    if shell.launches:
        chosen = shell.launches[-1]
        if len(shell.launches) > 1:
            shell.note(f"the script launches {len(shell.launches)} commands; the last one is "
                       "read")
    else:
        chosen = [f for cmd in shell.commands for f in (*cmd, ";")]
        if not any(f.startswith("--") for f in chosen):  # flags held in variables only
            held = [*shell.scalars.values(), *(" ".join(v) for v in shell.arrays.values())]
            chosen = [w for value in held if value.lstrip().startswith("--")
                      for w in (*value.split(), ";")]
    unset = [n for n in shell.unset if any(
        UNSET + "${" + n + "}" in f for f in chosen)]
    return Script(words=chosen, unset=unset, notes=shell.notes, is_script=is_script)


def unset_name(value: str) -> str | None:
    """The variable an unexpanded value waits for (``NUM_LAYERS``, ``2`` for ``$2``); None when
    what is left is not a variable (a command substitution, arithmetic, an expansion tune-cp
    does not read)."""
    m = re.search(re.escape(UNSET) + r"\$\{([A-Za-z_][A-Za-z0-9_]*|\d+)\}", value)
    return m.group(1) if m else None


def describe_unset(name: str | None, value: str = "") -> str:
    """What an unexpanded value waits for and how to give it: ``--env NAME=VALUE`` for a
    variable, else (``name`` None: a command substitution, arithmetic or an expansion tune-cp
    does not read, ``value`` as written) the value itself."""
    if name is None:
        shown = _shown(value.replace(UNSET, "")) if value else "it"
        return (f"{shown}, which tune-cp leaves unexpanded (it runs no commands); give the value "
                f"with tune-cp's own flag, or paste the command with its values filled in (for "
                f"example from the launch log)")
    if name.isdigit():
        return (f"the script's argument ${name}, which it was not given; pass --env "
                f"{name}=VALUE")
    return f"${name}, which the script takes from the environment; pass --env {name}=VALUE"
