package prober

import (
	"net"
	"syscall"
)

// probeDialer is kubelet's probe dialer: SO_LINGER 1 s so that closing a probe's connection
// sends a RST instead of leaving a socket in TIME_WAIT for each probe (a node probing many
// containers every second would run out of ports).
func probeDialer() *net.Dialer {
	return &net.Dialer{
		Control: func(network, address string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) {
				_ = syscall.SetsockoptLinger(int(fd), syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1, Linger: 1})
			})
		},
	}
}
