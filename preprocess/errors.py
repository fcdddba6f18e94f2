"""The one exception type the CLI turns into ``error: <file>: <problem>`` and exit code 2."""


class PreprocessError(Exception):
    """Bad input or an unusable output folder, named by the file it concerns.

    Raised for problems a user can fix (truncated dump, wrong file, non-UTF-8
    bytes, too large a vocabulary ...). Bugs stay ordinary exceptions so they
    keep their traceback.
    """

    def __init__(self, path, problem):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
