"""The optimizer: which passes run (the CANN switch file, --enable/--disable), the rounds
over the rules, verification against the original and the writing of the result; the
phases' timings."""
