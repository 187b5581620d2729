"""The one rule for class names (train/class_names.py), whatever they come from."""

import pytest

from train.class_names import MAX_NAME_LENGTH, check_class_names


def test_good_names_pass_as_strings():
    assert check_class_names(["cat", "dog", 3, "hot dog", "chat noir é"], "x") == [
        "cat",
        "dog",
        "3",
        "hot dog",
        "chat noir é",
    ]


@pytest.mark.parametrize(
    "names, words",
    [
        (["cat", ""], "class 1 ('') is empty"),
        (["   "], "only whitespace"),
        (["cat", " cat"], "starts or ends with whitespace"),
        (["a\x1b[31mred"], "control characters"),
        (["a\nb"], "control characters"),
        (["x" * (MAX_NAME_LENGTH + 1)], "characters long"),
        (["cat", "dog", "cat"], "class 2 ('cat') repeats class 0"),
    ],
)
def test_names_that_would_confuse_an_answer_are_refused(names, words):
    with pytest.raises(ValueError) as err:
        check_class_names(names, "--labels=l.txt")
    assert words in str(err.value) and str(err.value).startswith("--labels=l.txt: ")
