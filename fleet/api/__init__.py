"""The faces a Python program uses: the embedded fleet (roles) and the executor."""
