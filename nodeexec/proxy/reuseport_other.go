//go:build unix && !freebsd

package proxy

import "golang.org/x/sys/unix"

const reusePort = unix.SO_REUSEPORT
