"""Makes ``tests`` a regular package so ``from tests.conftest import ...`` resolves here, not to the stray
``tests`` package that iterative-stratification installs into site-packages."""
