"""The foundation: errors, record types, a request's result, words."""
