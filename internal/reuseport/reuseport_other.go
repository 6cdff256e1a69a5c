//go:build unix && !freebsd

package reuseport

import "golang.org/x/sys/unix"

const reusePort = unix.SO_REUSEPORT
