package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	agentproto "sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

// The upstream agent's defaults (cmd/agent/app/options): how soon it reconnects, how far its
// back-off grows, how many DATA packets wait for one slow connection, how long a dial may take.
const (
	syncInterval    = time.Second
	syncIntervalCap = 10 * time.Second
	xfrChannelSize  = 150
	dialTimeout     = 5 * time.Second
	// headerTimeout bounds the wait for the server's first answer on a new stream: a server
	// that accepts TLS and never answers would otherwise hold the agent forever.
	headerTimeout = 30 * time.Second
	// keepaliveTime is the gRPC keepalive of the stream: short enough that a NAT on the way
	// keeps the idle stream's mapping, and that a dead uplink is noticed within about a minute,
	// not below the server's enforcement minimum (30s), which would close the stream.
	keepaliveTime = time.Minute
)

// DialFunc connects one connection the server asks for (the DIAL_REQ's protocol and address).
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// Config is what an Agent needs.
type Config struct {
	// Server is the konnectivity server's agent address, host:port.
	Server string
	// TLS verifies the server (RootCAs, ServerName) and carries the client certificate, if any.
	TLS *tls.Config
	// TokenFile holds a bearer token sent with each stream (the server's service account
	// authentication), read at each connection so that a rotated token is used; empty: none.
	TokenFile string
	// AgentID names the agent to the server (one stream per server per agent ID).
	AgentID string
	// Identifiers returns the agent identifiers ("host=NAME&ipv4=IP", see Identifiers), asked at
	// each connection: the server routes a connection to the agent whose identifiers name its
	// destination host (--proxy-strategies=destHost).
	Identifiers func() string
	// Dial connects what the server asks for; its error is sent back to the server (and so to
	// the apiserver) as the dial's error.
	Dial DialFunc
	Log  *slog.Logger
}

// Agent is the agent side of one konnectivity tunnel.
type Agent struct {
	cfg Config
}

// New returns an agent; Run runs it.
func New(cfg Config) *Agent {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Agent{cfg: cfg}
}

// errDuplicate is a new stream that reached a server the agent has a stream to already: with
// servers in HA behind one address, the agent connects until it holds one stream to each.
var errDuplicate = errors.New("already connected to this server")

// Run keeps the agent connected until ctx ends: one stream per server, as many as the servers
// report, each reconnected with back-off when it ends. It returns nil once ctx ended and every
// stream and connection it served has ended.
func (a *Agent) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ended := make(chan string)
	streams := map[string]bool{} // server IDs with a live stream; only this goroutine touches it
	want := 1                    // streams to keep: the latest serverCount a server sent
	backOff := syncInterval
	a.cfg.Log.Info("tunnel starting", "server", a.cfg.Server, "agentID", a.cfg.AgentID)
	for {
		var wait <-chan time.Time
		if len(streams) < want {
			s, err := a.connect(ctx)
			if err == nil && streams[s.serverID] {
				// The server's load balancer sent us to a server we hold a stream to already.
				s.cancel()
				s.conn.Close()
				err = errDuplicate
			}
			switch {
			case ctx.Err() != nil:
				return nil
			case errors.Is(err, errDuplicate):
				// Another server of the set is yet to be reached: try again at the sync interval.
				wait = time.After(jitter(syncInterval))
			case err != nil:
				a.cfg.Log.Warn("tunnel: cannot connect to the konnectivity server; retrying", "server", a.cfg.Server, "err", err, "retryIn", backOff)
				wait = time.After(jitter(backOff))
				backOff = min(time.Duration(float64(backOff)*1.5), syncIntervalCap)
			default:
				backOff = syncInterval
				streams[s.serverID] = true
				want = max(1, s.serverCount)
				a.cfg.Log.Info("tunnel connected", "server", a.cfg.Server, "serverID", s.serverID, "serverCount", s.serverCount)
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := s.serve(ctx)
					if ctx.Err() == nil {
						a.cfg.Log.Warn("tunnel stream ended; reconnecting", "server", a.cfg.Server, "serverID", s.serverID, "err", err)
					}
					select {
					case ended <- s.serverID:
					case <-ctx.Done():
					}
				}()
				if len(streams) < want {
					wait = time.After(jitter(syncInterval))
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case id := <-ended:
			delete(streams, id)
		case <-wait: // nil when every stream is up: wait for one to end
		}
	}
}

// jitter adds up to 10% to d, as the upstream agent's back-off does, so that a fleet of gateways
// that lost the server together does not reconnect in lockstep.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration(rand.Float64()*0.1*float64(d))
}

// connect opens a stream to the server and reads its ID and the number of servers.
func (a *Agent) connect(ctx context.Context) (*stream, error) {
	conn, err := grpc.NewClient(a.cfg.Server,
		grpc.WithTransportCredentials(credentials.NewTLS(a.cfg.TLS)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, PermitWithoutStream: true}))
	if err != nil {
		return nil, fmt.Errorf("konnectivity server %s: %w", a.cfg.Server, err)
	}
	md := []string{header.AgentID, a.cfg.AgentID, header.AgentIdentifiers, a.cfg.Identifiers()}
	if a.cfg.TokenFile != "" {
		token, err := os.ReadFile(a.cfg.TokenFile)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("tunnel token: %w", err)
		}
		md = append(md, header.AuthenticationTokenContextKey, header.AuthenticationTokenContextSchemePrefix+strings.TrimSpace(string(token)))
	}
	streamCtx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, md...))
	fail := func(err error) (*stream, error) {
		cancel()
		conn.Close()
		return nil, err
	}
	st, err := agentproto.NewAgentServiceClient(conn).Connect(streamCtx)
	if err != nil {
		return fail(fmt.Errorf("konnectivity server %s: %w", a.cfg.Server, err))
	}
	timer := time.AfterFunc(headerTimeout, cancel)
	hdr, err := st.Header()
	timer.Stop()
	if err != nil {
		return fail(fmt.Errorf("konnectivity server %s: %w", a.cfg.Server, err))
	}
	ids, counts := hdr.Get(header.ServerID), hdr.Get(header.ServerCount)
	if len(ids) != 1 || len(counts) != 1 {
		return fail(fmt.Errorf("konnectivity server %s: want one %s and one %s header, got %v and %v", a.cfg.Server, header.ServerID, header.ServerCount, ids, counts))
	}
	count, err := strconv.Atoi(counts[0])
	if err != nil {
		return fail(fmt.Errorf("konnectivity server %s: %s %q: %w", a.cfg.Server, header.ServerCount, counts[0], err))
	}
	return &stream{a: a, conn: conn, st: st, cancel: cancel, serverID: ids[0], serverCount: count, endpoints: map[int64]*endpoint{}}, nil
}

// stream is one agent stream to one server, and the connections it carries.
type stream struct {
	a           *Agent
	conn        *grpc.ClientConn
	st          agentproto.AgentService_ConnectClient
	cancel      context.CancelFunc // ends the stream
	serverID    string
	serverCount int

	sendMu sync.Mutex // serializes st.Send: gRPC streams allow one sender at a time

	mu        sync.Mutex // protects endpoints, nextID and closed
	endpoints map[int64]*endpoint
	nextID    int64
	closed    bool // the stream ended: no endpoint is added any more

	wg sync.WaitGroup // the dials and each endpoint's two copiers
}

// endpoint is one connection the server asked for, connected by Dial.
type endpoint struct {
	id      int64
	conn    net.Conn
	data    chan []byte   // DATA from the server, for the writer
	done    chan struct{} // closed by close: the writer stops
	closing sync.Once
}

// serve runs the stream until it fails or ctx ends, then closes every connection it carried
// and returns once all of its goroutines have.
func (s *stream) serve(ctx context.Context) error {
	defer s.conn.Close()
	defer s.wg.Wait()
	defer s.closeAll()
	defer s.cancel()
	for {
		pkt, err := s.st.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("receive from konnectivity server %s: %w", s.serverID, err)
		}
		switch pkt.Type {
		case client.PacketType_DIAL_REQ:
			req := pkt.GetDialRequest()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.dial(ctx, req)
			}()
		case client.PacketType_DATA:
			data := pkt.GetData()
			if ep := s.endpoint(data.ConnectID); ep != nil {
				// Blocks while the connection's queue is full, as the upstream agent does: the
				// stream's flow control then slows the server down.
				select {
				case ep.data <- data.Data:
				case <-ep.done:
				}
			} else {
				s.send(closeResponse(data.ConnectID, "unrecognized connectID"))
			}
		case client.PacketType_CLOSE_REQ:
			id := pkt.GetCloseRequest().ConnectID
			if ep := s.endpoint(id); ep != nil {
				s.closeEndpoint(ep, true)
			} else {
				s.send(closeResponse(id, "Unknown connectID"))
			}
		default:
			// DIAL_CLS (a dial the server gave up on) and packets of newer protocols: nothing to
			// do, as with the upstream agent; a dial that completes later is closed by the server.
			s.a.cfg.Log.Debug("tunnel: packet ignored", "type", pkt.Type.String())
		}
	}
}

// dial connects one DIAL_REQ and answers it; on success it starts the connection's copiers.
func (s *stream) dial(ctx context.Context, req *client.DialRequest) {
	resp := &client.DialResponse{Random: req.Random}
	dialCtx, cancel := context.WithTimeout(ctx, dialTimeout)
	conn, err := s.a.cfg.Dial(dialCtx, req.Protocol, req.Address)
	cancel()
	if err != nil {
		s.a.cfg.Log.Info("tunnel: dial refused", "address", req.Address, "protocol", req.Protocol, "err", err)
		resp.Error = err.Error()
		s.send(&client.Packet{Type: client.PacketType_DIAL_RSP, Payload: &client.Packet_DialResponse{DialResponse: resp}})
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		conn.Close()
		return
	}
	s.nextID++
	ep := &endpoint{id: s.nextID, conn: conn, data: make(chan []byte, xfrChannelSize), done: make(chan struct{})}
	s.endpoints[ep.id] = ep
	s.mu.Unlock()
	s.a.cfg.Log.Debug("tunnel: connection opened", "address", req.Address, "connectionID", ep.id)
	resp.ConnectID = ep.id
	if err := s.send(&client.Packet{Type: client.PacketType_DIAL_RSP, Payload: &client.Packet_DialResponse{DialResponse: resp}}); err != nil {
		s.closeEndpoint(ep, false)
		return
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.toServer(ep)
	}()
	go func() {
		defer s.wg.Done()
		s.fromServer(ep)
	}()
}

// toServer copies what the connection reads to the server, until either side closes it.
func (s *stream) toServer(ep *endpoint) {
	defer s.closeEndpoint(ep, true)
	buf := make([]byte, 32<<10)
	for {
		n, err := ep.conn.Read(buf)
		if n > 0 {
			// Send serializes the packet before it returns, so buf is free again after it.
			pkt := &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: ep.id, Data: buf[:n]}}}
			if s.send(pkt) != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// fromServer writes the server's DATA to the connection, until either side closes it.
func (s *stream) fromServer(ep *endpoint) {
	for {
		select {
		case b := <-ep.data:
			if _, err := ep.conn.Write(b); err != nil {
				s.closeEndpoint(ep, true)
				return
			}
		case <-ep.done:
			return
		}
	}
}

func (s *stream) endpoint(id int64) *endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endpoints[id]
}

// closeEndpoint closes a connection once, and tells the server (CLOSE_RSP) when tell is set and
// the stream is still up.
func (s *stream) closeEndpoint(ep *endpoint, tell bool) {
	ep.closing.Do(func() {
		s.mu.Lock()
		delete(s.endpoints, ep.id)
		closed := s.closed
		s.mu.Unlock()
		close(ep.done)
		ep.conn.Close()
		if tell && !closed {
			s.send(closeResponse(ep.id, ""))
		}
		s.a.cfg.Log.Debug("tunnel: connection closed", "connectionID", ep.id)
	})
}

// closeAll closes every connection of a stream that ended; dials still running close theirs.
func (s *stream) closeAll() {
	s.mu.Lock()
	s.closed = true
	eps := make([]*endpoint, 0, len(s.endpoints))
	for _, ep := range s.endpoints {
		eps = append(eps, ep)
	}
	s.mu.Unlock()
	for _, ep := range eps {
		s.closeEndpoint(ep, false)
	}
}

// send sends one packet; a failure ends the stream (its Recv fails too), so it is only logged.
func (s *stream) send(pkt *client.Packet) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if err := s.st.Send(pkt); err != nil {
		s.a.cfg.Log.Debug("tunnel: send failed", "type", pkt.Type.String(), "err", err)
		s.cancel()
		return err
	}
	return nil
}

func closeResponse(id int64, errMsg string) *client.Packet {
	return &client.Packet{Type: client.PacketType_CLOSE_RSP, Payload: &client.Packet_CloseResponse{CloseResponse: &client.CloseResponse{ConnectID: id, Error: errMsg}}}
}
