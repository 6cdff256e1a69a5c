package reuseport

import "golang.org/x/sys/unix"

// On FreeBSD, SO_REUSEPORT lets sockets share an address but gives every
// connection to one of them; SO_REUSEPORT_LB spreads them as Linux does.
const reusePort = unix.SO_REUSEPORT_LB
