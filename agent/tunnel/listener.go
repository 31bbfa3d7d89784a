package tunnel

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// Listener is a net.Listener whose connections come from Dial in the same process, never from
// the network: the node API serves it, and the tunnel dials it for each connection the
// apiserver opens through the konnectivity server.
type Listener struct {
	addr   tunnelAddr
	conns  chan net.Conn // unbuffered: a Dial waits for an Accept
	closed chan struct{}
	once   sync.Once
}

// NewListener returns a listener whose address is name (what the node API logs it as).
func NewListener(name string) *Listener {
	return &Listener{addr: tunnelAddr(name), conns: make(chan net.Conn), closed: make(chan struct{})}
}

// Accept waits for the next connection Dial made, or for Close.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close makes Accept and Dial fail; connections already handed over are the server's to close.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr is the listener's name.
func (l *Listener) Addr() net.Addr { return l.addr }

// Dial hands one end of a new in-memory connection to the listener's Accept and returns the
// other. It waits until the server accepts it, ctx ends, or the listener is closed: a server
// that does not serve (yet, or any more) is an error for the dialer, as a refused connection.
func (l *Listener) Dial(ctx context.Context) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- &pipeConn{Conn: server, local: l.addr, remote: tunnelAddr("konnectivity")}:
		return &pipeConn{Conn: client, local: tunnelAddr("konnectivity"), remote: l.addr}, nil
	case <-l.closed:
	case <-ctx.Done():
	}
	client.Close()
	server.Close()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dial %s: %w", l.addr, err)
	}
	return nil, fmt.Errorf("dial %s: %w", l.addr, net.ErrClosed)
}

// pipeConn is one end of a net.Pipe with addresses that say where it comes from, for logs.
type pipeConn struct {
	net.Conn
	local, remote net.Addr
}

func (c *pipeConn) LocalAddr() net.Addr  { return c.local }
func (c *pipeConn) RemoteAddr() net.Addr { return c.remote }

// tunnelAddr is the address of an in-memory connection's end.
type tunnelAddr string

func (a tunnelAddr) Network() string { return "tunnel" }
func (a tunnelAddr) String() string  { return string(a) }
