"""The release's sdist and wheel, checked and run (``make package``; not part of ``make test``).

``python -m tests.package --dist DIR --work DIR`` reads what ``python -m build`` wrote into DIR,
checks what each archive holds, installs the wheel with its dependencies into a fresh virtualenv
under the work directory and runs it there, from an empty directory.
"""
