"""Every exit code the ``cotrain`` command uses, in one registry."""

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    #: an unexpected failure (a bug): the message says where
    ERROR = 1
    #: a bad command line: unknown flag, missing argument
    USAGE = 2
    #: a bad run config, data source or checkpoint: the message names the field or file
    CONFIG = 3
    #: the coordinator refused the join token
    UNAUTHENTICATED = 4
    #: the coordinator speaks no protocol version this node speaks
    PROTOCOL = 5
    #: the coordinator could not be reached in time
    UNAVAILABLE = 6
    #: the state dir belongs to another run, or a token name is taken
    STATE = 7
    #: the operator's Ray cluster could not be reached or failed to place the managed nodes (sizes known not to fit
    #: at start are CONFIG)
    FLEET = 8
    #: stopped by Ctrl-C before finishing
    INTERRUPTED = 130
