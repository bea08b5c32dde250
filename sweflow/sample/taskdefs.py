"""The source of the sample tasks: each bug's fix and its tests, written as edits of the sample repository.

`python -m sweflow.sample.taskdefs` regenerates `tasks/<instance_id>/{gold.patch,test.patch,meta.json}` by
applying these edits in a real clone at the base commit and asking git for the diffs, then running the tests
before and after the fix to derive FAIL_TO_PASS / PASS_TO_PASS.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# An edit: (path, old, new). `old` must occur exactly once in the file; old=None appends `new`.
Edit = tuple[str, str | None, str]


@dataclass(frozen=True)
class TaskDef:
    number: int
    base: str  # a commit name from repo.HISTORY
    created_at: str
    problem_statement: str
    gold: tuple[Edit, ...]
    tests: tuple[Edit, ...]
    fail_to_pass: tuple[str, ...]  # expected; regeneration checks the measured list equals it
    hints_text: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def instance_id(self) -> str:
        return f"sweflow__calclib-{self.number}"


# The stored files are what the library ships; this module is only needed to change them.
TASKS: tuple[TaskDef, ...] = (
    TaskDef(
        number=1,
        base="initial",
        created_at="2024-01-15T08:12:44Z",
        problem_statement="""\
Scientific notation is split into a number and a name

`tokenize("6.02e23")` returns a NUMBER token `6.02` followed by a NAME token `e23` instead of one number.
The same happens with a signed exponent: `tokenize("2.5E-3")` gives `2.5`, `E`, `-`, `3`.

Expected: a single NUMBER token whose `.value` is the float (`6.02e23`, `0.0025`). `Token.value`
already treats `e`/`E` as a float marker, so it looks like only the scanner is missing the exponent part.
A bare trailing `e` (as in `2e`) is not an exponent and should stay a separate name.
""",
        hints_text="The number scanner stops after the fractional part.",
        gold=(
            (
                "calclib/tokenizer.py",
                """        while i < n and text[i].isdigit():
            i += 1
    return i
""",
                """        while i < n and text[i].isdigit():
            i += 1
    if i < n and text[i] in "eE":
        j = i + 1
        if j < n and text[j] in "+-":
            j += 1
        if j < n and text[j].isdigit():
            while j < n and text[j].isdigit():
                j += 1
            i = j
    return i
""",
            ),
        ),
        tests=(
            (
                "tests/test_tokenizer.py",
                None,
                """

def test_scientific_notation():
    tokens = tokenize("6.02e23 + 1E3")
    assert [t.kind for t in tokens] == [NUMBER, OP, NUMBER, END]
    assert tokens[0].value == 6.02e23
    assert tokens[2].value == 1000.0


def test_signed_exponent():
    tokens = tokenize("2.5E-3")
    assert len(tokens) == 2
    assert tokens[0].value == pytest.approx(0.0025)


def test_trailing_e_is_a_name():
    tokens = tokenize("2e")
    assert [(t.kind, t.text) for t in tokens[:2]] == [(NUMBER, "2"), (NAME, "e")]
""",
            ),
        ),
        fail_to_pass=(
            "tests/test_tokenizer.py::test_scientific_notation",
            "tests/test_tokenizer.py::test_signed_exponent",
        ),
    ),
    TaskDef(
        number=2,
        base="initial",
        created_at="2024-01-22T17:03:10Z",
        problem_statement="""\
Exponentiation chains group from the left

`parse("2^3^2")` produces `Binary('^', Binary('^', Num(2), Num(3)), Num(2))`, i.e. `(2^3)^2 = 64`.
In mathematics (and in Python's `**`) exponentiation is right-associative, so this should be
`2^(3^2) = 512`. The same applies to `2 ** 3 ** 2`. Other operators are fine: `8 - 3 - 2` must keep
grouping from the left.
""",
        gold=(
            ("calclib/parser.py", "RIGHT_ASSOCIATIVE = frozenset()", 'RIGHT_ASSOCIATIVE = frozenset({"^"})'),
        ),
        tests=(
            (
                "tests/test_parser.py",
                None,
                """

def test_power_is_right_associative():
    assert parse("2 ^ 3 ^ 2") == Binary("^", Num(2), Binary("^", Num(3), Num(2)))


def test_double_star_is_right_associative():
    assert parse("a ** b ** c") == Binary("^", Name("a"), Binary("^", Name("b"), Name("c")))
""",
            ),
        ),
        fail_to_pass=(
            "tests/test_parser.py::test_power_is_right_associative",
            "tests/test_parser.py::test_double_star_is_right_associative",
        ),
    ),
    TaskDef(
        number=3,
        base="evaluator",
        created_at="2024-02-09T10:41:27Z",
        problem_statement="""\
calc("-2^2") returns 4 instead of -4

```python
>>> from calclib import calc
>>> calc("-2^2")
4
```

Unary minus currently binds tighter than `^`, so the expression is read as `(-2)^2`. The usual convention
(and Python's `-2**2 == -4`) is that the power is applied first. `(-2)^2` with explicit parentheses should
still give 4, and `2^-1` should keep working (0.5).
""",
        hints_text="See UNARY_PRECEDENCE in calclib/parser.py.",
        gold=(("calclib/parser.py", "UNARY_PRECEDENCE = 40", "UNARY_PRECEDENCE = 30"),),
        tests=(
            (
                "tests/test_evaluator.py",
                None,
                """

def test_unary_minus_binds_looser_than_power():
    assert calc("-2^2") == -4
    assert calc("-x ** 2", x=3) == -9


def test_parenthesised_negative_base():
    assert calc("(-2)^2") == 4


def test_negative_exponent():
    assert calc("2^-1") == 0.5
""",
            ),
        ),
        fail_to_pass=("tests/test_evaluator.py::test_unary_minus_binds_looser_than_power",),
    ),
    TaskDef(
        number=4,
        base="evaluator",
        created_at="2024-02-14T13:20:05Z",
        problem_statement="""\
Division by zero escapes as ZeroDivisionError

All input errors are supposed to be `CalcError` subclasses so callers can catch one exception type, but

```python
>>> calc("1 / (x - x)", x=3)
Traceback (most recent call last):
  ...
ZeroDivisionError: division by zero
```

The same happens with `%`. These should raise `calclib.EvaluationError` with a message that says
"division by zero".
""",
        gold=(
            (
                "calclib/evaluator.py",
                """            right = self.evaluate(node.right)
            return BINARY_OPERATORS[node.op](left, right)
""",
                """            right = self.evaluate(node.right)
            try:
                return BINARY_OPERATORS[node.op](left, right)
            except ZeroDivisionError:
                raise EvaluationError(f"division by zero in {node.op!r}") from None
""",
            ),
        ),
        tests=(
            (
                "tests/test_evaluator.py",
                None,
                """

@pytest.mark.parametrize("text", ["1 / 0", "1 / (x - x)", "5 % 0"], ids=["literal", "variable", "modulo"])
def test_division_by_zero_is_evaluation_error(text):
    with pytest.raises(EvaluationError, match="division by zero"):
        calc(text, x=3)
""",
            ),
        ),
        fail_to_pass=(
            "tests/test_evaluator.py::test_division_by_zero_is_evaluation_error[literal]",
            "tests/test_evaluator.py::test_division_by_zero_is_evaluation_error[variable]",
            "tests/test_evaluator.py::test_division_by_zero_is_evaluation_error[modulo]",
        ),
    ),
    TaskDef(
        number=5,
        base="units_stats",
        created_at="2024-03-18T09:55:31Z",
        problem_statement="""\
median() of an even number of values returns the upper middle value

`calclib.stats.median([1, 2, 3, 4])` returns `3`. For an even count the median is the mean of the two
middle values, `2.5`. Odd counts are correct. `summary()` reports the same wrong median.
""",
        gold=(
            (
                "calclib/stats.py",
                """    values = sorted(_require_data(data, "median"))
    return values[len(values) // 2]
""",
                """    values = sorted(_require_data(data, "median"))
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2
""",
            ),
        ),
        tests=(
            (
                "tests/test_stats.py",
                """def test_mode_prefers_smallest_on_ties():""",
                """def test_median_even_length():
    assert median([4, 1, 3, 2]) == 2.5


def test_summary_median_even_length():
    assert summary([1, 2, 3, 10])["median"] == 2.5


def test_mode_prefers_smallest_on_ties():""",
            ),
        ),
        fail_to_pass=(
            "tests/test_stats.py::test_median_even_length",
            "tests/test_stats.py::test_summary_median_even_length",
        ),
    ),
    TaskDef(
        number=6,
        base="units_stats",
        created_at="2024-03-21T15:07:48Z",
        problem_statement="""\
variance() divides by n although it is documented as the sample variance

The docstring of `calclib.stats.variance` says "Sample variance (the n - 1 denominator)", but
`variance([2, 4, 4, 4, 5, 5, 7, 9])` returns `4.0`, which is the population variance. The sample variance
is `32 / 7 = 4.571...`; `stdev` inherits the error. With a single data point the sample variance is
undefined and should raise `StatisticsError` rather than return 0.
""",
        hints_text="Python's statistics.variance behaves the way the docstring describes.",
        gold=(
            (
                "calclib/stats.py",
                """    values = _require_data(data, "variance")
    centre = mean(values)
    return sum((x - centre) ** 2 for x in values) / len(values)
""",
                """    values = _require_data(data, "variance")
    if len(values) < 2:
        raise StatisticsError("variance requires at least two data points")
    centre = mean(values)
    return sum((x - centre) ** 2 for x in values) / (len(values) - 1)
""",
            ),
        ),
        tests=(
            (
                "tests/test_stats.py",
                None,
                """

def test_variance_is_sample_variance():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(32 / 7)


def test_stdev_is_sample_stdev():
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx((32 / 7) ** 0.5)


def test_variance_needs_two_points():
    with pytest.raises(StatisticsError, match="two data points"):
        variance([3])
""",
            ),
        ),
        fail_to_pass=(
            "tests/test_stats.py::test_variance_is_sample_variance",
            "tests/test_stats.py::test_stdev_is_sample_stdev",
            "tests/test_stats.py::test_variance_needs_two_points",
        ),
    ),
    TaskDef(
        number=7,
        base="units_stats",
        created_at="2024-03-25T11:30:02Z",
        problem_statement="""\
Converting to Fahrenheit gives wrong results

`convert(100, "C", "F")` returns `87.77...` instead of `212`, and `convert(0, "K", "F")` returns `-119.7...`
instead of `-459.67`. Converting *from* Fahrenheit works (`convert(212, "F", "C") == 100`), so only the
direction into Fahrenheit is affected.
""",
        gold=(
            (
                "calclib/units.py",
                "    return (kelvin - 273.15) * 5 / 9 + 32\n",
                "    return (kelvin - 273.15) * 9 / 5 + 32\n",
            ),
        ),
        tests=(
            (
                "tests/test_units.py",
                "def test_dimension_names():",
                """@pytest.mark.parametrize(
    "value,source,expected",
    [(100, "C", 212.0), (0, "C", 32.0), (0, "K", -459.67), (-40, "C", -40.0)],
)
def test_to_fahrenheit(value, source, expected):
    assert convert(value, source, "F") == pytest.approx(expected)


def test_fahrenheit_round_trip():
    assert convert(convert(37.5, "C", "F"), "F", "C") == pytest.approx(37.5)


def test_dimension_names():""",
            ),
        ),
        fail_to_pass=(
            "tests/test_units.py::test_to_fahrenheit[100-C-212.0]",
            "tests/test_units.py::test_to_fahrenheit[-40-C--40.0]",
            "tests/test_units.py::test_to_fahrenheit[0-K--459.67]",
            "tests/test_units.py::test_fahrenheit_round_trip",
        ),
    ),
    TaskDef(
        number=8,
        base="units_stats",
        created_at="2024-03-28T07:48:19Z",
        problem_statement="""\
percentile() raises IndexError for p=100 and for single-value data

```python
>>> from calclib.stats import percentile
>>> percentile([1, 2, 3, 4], 100)
IndexError: list index out of range
>>> percentile([5], 50)
IndexError: list index out of range
```

`percentile(data, 100)` should return the maximum, and any percentile of a single value is that value.
""",
        gold=(
            (
                "calclib/stats.py",
                """    high = low + 1
    return values[low]""",
                """    high = min(low + 1, len(values) - 1)
    return values[low]""",
            ),
        ),
        tests=(
            (
                "tests/test_stats.py",
                None,
                """

def test_percentile_hundred_is_maximum():
    assert percentile([4, 1, 3, 2], 100) == 4


def test_percentile_of_single_value():
    assert percentile([5], 50) == 5
""",
            ),
        ),
        fail_to_pass=(
            "tests/test_stats.py::test_percentile_hundred_is_maximum",
            "tests/test_stats.py::test_percentile_of_single_value",
        ),
    ),
    TaskDef(
        number=9,
        base="docs",
        created_at="2024-04-08T12:02:36Z",
        problem_statement="""\
Bad function arguments leak TypeError / ValueError out of calc()

```python
>>> calc("sqrt(-1)")
ValueError: math domain error
>>> calc("sqrt(1, 2)")
TypeError: math.sqrt() takes exactly one argument (2 given)
```

Every other input error is a `CalcError`; these should raise `calclib.EvaluationError` naming the function.
""",
        gold=(
            (
                "calclib/evaluator.py",
                """            return func(*(self.evaluate(arg) for arg in node.args))
""",
                """            args = [self.evaluate(arg) for arg in node.args]
            try:
                return func(*args)
            except (TypeError, ValueError) as exc:
                raise EvaluationError(f"{node.func}(): {exc}") from None
""",
            ),
        ),
        tests=(
            (
                "tests/test_evaluator.py",
                None,
                """

@pytest.mark.parametrize("text", ["sqrt(-1)", "sqrt(1, 2)", "max()"], ids=["domain", "arity", "empty"])
def test_bad_function_arguments_are_evaluation_errors(text):
    with pytest.raises(EvaluationError, match=text.split("(")[0]):
        calc(text)
""",
            ),
        ),
        fail_to_pass=(
            "tests/test_evaluator.py::test_bad_function_arguments_are_evaluation_errors[domain]",
            "tests/test_evaluator.py::test_bad_function_arguments_are_evaluation_errors[arity]",
            "tests/test_evaluator.py::test_bad_function_arguments_are_evaluation_errors[empty]",
        ),
    ),
)
