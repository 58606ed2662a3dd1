'use strict'
// A code-edit request for SmolLM2's chat format: rename a function in a short Python file, with
// the reply started at the renamed line, so the rest of the reply is mostly a copy of the file.
// Shared by the fill suite (__test__/fill.test.js) and its benchmark (scripts/bench-fill.js).
const CODE = `def add_all(values):
    total = 0
    for v in values:
        if v > 0:
            total += v
    return total


def mean(values):
    """The mean of the values."""
    return add_all(values) / len(values)


def count_positive(values):
    n = 0
    for v in values:
        if v > 0:
            n += 1
    return n
`

const EDIT = '<|im_start|>user\nRename add_all to sum_positive in this file and show the whole file.\n```python\n' + CODE +
  '```<|im_end|>\n<|im_start|>assistant\n```python\ndef sum_positive(values):\n'

module.exports = { CODE, EDIT }
