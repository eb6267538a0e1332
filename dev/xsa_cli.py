"""The command-line convention of xsa-train's Python tools, in one place: a bad flag or value ends in one
line, "PROG: error: ... (see --help)", and exit code 1, as the C++ programs end (argparse's own parser
prints its usage too and exits with 2)."""
import argparse


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(1, f"{self.prog}: error: {message} (see --help)\n")
