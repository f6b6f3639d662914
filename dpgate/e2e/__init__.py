"""`dpgate e2e`: one topology run the way a cluster job runs it, in stages with a budget each, ending
in a verdict written as a JSON sentinel (see docs/e2e.md)."""
