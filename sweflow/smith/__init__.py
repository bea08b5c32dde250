"""SWE-smith: synthesize validated tasks from a repository whose tests pass.

profile (repo, commit, install, test command, parser) -> environment + reference run -> bug candidates ->
before/after validation with k stable runs -> SWE-bench rows whose bugged states are commits in a local bare
repository -> problem statements -> the same parquet schema the data stage reads.
"""

# The bug candidates: procedural AST modifiers, LM rewrites, PR mirrors, combinations of validated bugs.
