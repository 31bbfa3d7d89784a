package tunnel

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log/slog"
	"math/big"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	agentproto "sigs.k8s.io/apiserver-network-proxy/proto/agent"
	"sigs.k8s.io/apiserver-network-proxy/proto/header"
)

func TestNodeAPIDialer(t *testing.T) {
	ln := NewListener("test")
	defer ln.Close()
	dial := NodeAPIDialer(ln, "gw-1", func() []string { return []string{"192.0.2.7", "2001:db8::7"} }, 10250)
	for _, tc := range []struct {
		network, address string
		toNodeAPI        bool
	}{
		{"tcp", "192.0.2.7:10250", true},
		{"tcp", "[2001:db8::7]:10250", true},
		{"tcp", "[2001:db8:0::7]:10250", true},
		{"tcp", "gw-1:10250", true},
		{"tcp", "192.0.2.7:22", false},       // another port of the node
		{"tcp", "192.0.2.8:10250", false},    // another host
		{"tcp", "10.88.0.5:8080", false},     // a pod
		{"udp", "192.0.2.7:10250", false},    // not a TCP dial
		{"tcp", "192.0.2.7", false},          // no port
		{"tcp", "gw-1.example:10250", false}, // not the node's name
	} {
		// Refused dials fail at once; the node API's are handed to the listener, whose Accept a
		// goroutine plays.
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err == nil {
				accepted <- c
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := dial(ctx, tc.network, tc.address)
		cancel()
		if tc.toNodeAPI {
			if err != nil {
				t.Errorf("%s %s: %v, want it handed to the node API", tc.network, tc.address, err)
				continue
			}
			server := <-accepted
			go server.Write([]byte("x"))
			b := make([]byte, 1)
			if _, err := io.ReadFull(c, b); err != nil || b[0] != 'x' {
				t.Errorf("%s %s: the pipe does not carry data: %q, %v", tc.network, tc.address, b, err)
			}
			c.Close()
			server.Close()
			continue
		}
		if err == nil {
			c.Close()
			t.Errorf("%s %s: dialed, want it refused", tc.network, tc.address)
		}
		// Unblock the Accept of this round with a dial of our own.
		if c, err := ln.Dial(context.Background()); err == nil {
			c.Close()
			(<-accepted).Close()
		}
	}
}

func TestListenerClosed(t *testing.T) {
	ln := NewListener("test")
	ln.Close()
	if _, err := ln.Accept(); err == nil {
		t.Error("Accept on a closed listener: no error")
	}
	if _, err := ln.Dial(context.Background()); err == nil {
		t.Error("Dial to a closed listener: no error")
	}
	// No server accepting: the dial gives up with its context.
	ln = NewListener("test")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := ln.Dial(ctx); err == nil {
		t.Error("Dial with no Accept: no error")
	}
}

func TestIdentifiers(t *testing.T) {
	got := Identifiers("gw-1", []string{"192.0.2.7", "2001:db8::7", "not-an-ip"})
	if want := "host=gw-1&ipv4=192.0.2.7&ipv6=2001%3Adb8%3A%3A7"; got != want {
		t.Errorf("Identifiers = %q, want %q", got, want)
	}
	parsed, err := header.GenAgentIdentifiers(got)
	if err != nil || len(parsed.Host) != 1 || len(parsed.IPv4) != 1 || len(parsed.IPv6) != 1 || parsed.IPv6[0] != "2001:db8::7" {
		t.Errorf("as the server parses it: %+v, %v", parsed, err)
	}
}

// fakeServer plays the konnectivity server's side of the agent stream, so that a test drives
// the agent packet by packet: each Connect is handed to the test, and ends when the test says.
type fakeServer struct {
	agentproto.UnimplementedAgentServiceServer
	streams chan fakeStream
	// ids returns the server ID and count of the next stream; nil: server-1 of 1.
	ids func() (id string, count int)
}

type fakeStream struct {
	agentproto.AgentService_ConnectServer
	md  metadata.MD
	id  string        // the server ID it announced
	end chan struct{} // closed by the test to end the stream
}

func (f *fakeServer) Connect(s agentproto.AgentService_ConnectServer) error {
	md, _ := metadata.FromIncomingContext(s.Context())
	id, count := "server-1", 1
	if f.ids != nil {
		id, count = f.ids()
	}
	if err := s.SendHeader(metadata.Pairs(header.ServerID, id, header.ServerCount, strconv.Itoa(count))); err != nil {
		return err
	}
	end := make(chan struct{})
	f.streams <- fakeStream{AgentService_ConnectServer: s, md: md, id: id, end: end}
	select {
	case <-end:
	case <-s.Context().Done():
	}
	return nil
}

// TestAgentProtocol: a dial to the node API opens a connection whose data goes both ways and
// whose end is told to the server; a dial elsewhere is answered with an error; DATA for an
// unknown connection gets a CLOSE_RSP with an error; a stream that ends is reconnected; Run
// returns once its context ends.
func TestAgentProtocol(t *testing.T) {
	fake := &fakeServer{streams: make(chan fakeStream)}
	nodeAPI, stop := runAgent(t, fake)
	defer stop()

	st := nextStream(t, fake)
	if got := st.md.Get(header.AgentID); len(got) != 1 || got[0] != "gw-1" {
		t.Errorf("agentID %v", got)
	}
	if got := st.md.Get(header.AgentIdentifiers); len(got) != 1 || got[0] != "host=gw-1&ipv4=192.0.2.7" {
		t.Errorf("agentIdentifiers %v", got)
	}

	// A dial elsewhere: refused, with the reason.
	send(t, st, &client.Packet{Type: client.PacketType_DIAL_REQ, Payload: &client.Packet_DialRequest{DialRequest: &client.DialRequest{Protocol: "tcp", Address: "10.88.0.5:8080", Random: 1}}})
	rsp := recv(t, st, client.PacketType_DIAL_RSP).GetDialResponse()
	if rsp.Random != 1 || rsp.Error == "" || rsp.ConnectID != 0 {
		t.Errorf("dial to a pod: %+v, want an error", rsp)
	}

	// A dial to the node API: the test plays the node API on the listener.
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := nodeAPI.Accept(); err == nil {
			accepted <- c
		}
	}()
	send(t, st, &client.Packet{Type: client.PacketType_DIAL_REQ, Payload: &client.Packet_DialRequest{DialRequest: &client.DialRequest{Protocol: "tcp", Address: "192.0.2.7:10250", Random: 2}}})
	rsp = recv(t, st, client.PacketType_DIAL_RSP).GetDialResponse()
	if rsp.Random != 2 || rsp.Error != "" || rsp.ConnectID == 0 {
		t.Fatalf("dial to the node API: %+v", rsp)
	}
	id := rsp.ConnectID
	conn := <-accepted
	send(t, st, &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: id, Data: []byte("ping")}}})
	b := make([]byte, 4)
	if _, err := io.ReadFull(conn, b); err != nil || string(b) != "ping" {
		t.Fatalf("node API read %q, %v", b, err)
	}
	go func() {
		conn.Write([]byte("pong"))
		conn.Close() // the node API ends the connection: the server hears of it
	}()
	if d := recv(t, st, client.PacketType_DATA).GetData(); d.ConnectID != id || string(d.Data) != "pong" {
		t.Errorf("DATA %+v, want pong on %d", d, id)
	}
	if c := recv(t, st, client.PacketType_CLOSE_RSP).GetCloseResponse(); c.ConnectID != id || c.Error != "" {
		t.Errorf("CLOSE_RSP %+v, want %d without error", c, id)
	}

	// DATA for a connection that is gone.
	send(t, st, &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: id, Data: []byte("late")}}})
	if c := recv(t, st, client.PacketType_CLOSE_RSP).GetCloseResponse(); c.ConnectID != id || c.Error == "" {
		t.Errorf("CLOSE_RSP %+v, want %d with an error", c, id)
	}

	// The stream ends (a server restart): the agent connects again by itself.
	close(st.end)
	st = nextStream(t, fake)
	stop()
	close(st.end)
}

// TestAgentHA: two servers behind one address (serverCount 2). The agent connects until it
// holds a stream to each: a stream that reaches a server it is connected to already is closed.
func TestAgentHA(t *testing.T) {
	var mu sync.Mutex
	next := []string{"server-a", "server-a", "server-b"} // the second connection lands on server-a again
	fake := &fakeServer{streams: make(chan fakeStream), ids: func() (string, int) {
		mu.Lock()
		defer mu.Unlock()
		id := next[0]
		if len(next) > 1 {
			next = next[1:]
		}
		return id, 2
	}}
	_, stop := runAgent(t, fake)
	defer stop()

	first := nextStream(t, fake)
	dup := nextStream(t, fake)
	if first.id != "server-a" || dup.id != "server-a" {
		t.Fatalf("streams to %s and %s, want server-a twice", first.id, dup.id)
	}
	// The agent closes the duplicate: its stream's context ends.
	select {
	case <-dup.Context().Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the duplicate stream to server-a was kept")
	}
	close(dup.end)
	second := nextStream(t, fake)
	if second.id != "server-b" {
		t.Fatalf("third stream to %s, want server-b", second.id)
	}
	// Both kept: neither stream ends while the agent runs.
	select {
	case <-first.Context().Done():
		t.Error("the stream to server-a ended")
	case <-second.Context().Done():
		t.Error("the stream to server-b ended")
	default:
	}
	stop()
	close(first.end)
	close(second.end)
}

// runAgent serves fake on a loopback TLS port and runs an agent of node gw-1 (192.0.2.7, node
// API port 10250) against it; the returned listener is where its node API dials arrive. stop
// ends the agent (waiting for Run to return) and the server, and may be called more than once.
func runAgent(t *testing.T, fake *fakeServer) (nodeAPI *Listener, stop func()) {
	t.Helper()
	serverTLS, clientTLS := testTLS(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS)))
	agentproto.RegisterAgentServiceServer(srv, fake)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	nodeAPI = NewListener("node API")
	a := New(Config{
		Server:      lis.Addr().String(),
		TLS:         clientTLS,
		AgentID:     "gw-1",
		Identifiers: func() string { return Identifiers("gw-1", []string{"192.0.2.7"}) },
		Dial:        NodeAPIDialer(nodeAPI, "gw-1", func() []string { return []string{"192.0.2.7"} }, 10250),
		Log:         slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	var once sync.Once
	return nodeAPI, func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-ran:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("Run did not return after its context ended")
			}
			nodeAPI.Close()
			srv.Stop()
			<-served
		})
	}
}

func nextStream(t *testing.T, f *fakeServer) fakeStream {
	t.Helper()
	select {
	case st := <-f.streams:
		return st
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not connect")
		return fakeStream{}
	}
}

func send(t *testing.T, st fakeStream, pkt *client.Packet) {
	t.Helper()
	if err := st.Send(pkt); err != nil {
		t.Fatalf("send %s: %v", pkt.Type, err)
	}
}

// recv receives the next packet, which must be of type want.
func recv(t *testing.T, st fakeStream, want client.PacketType) *client.Packet {
	t.Helper()
	pkt, err := st.Recv()
	if err != nil {
		t.Fatalf("receive %s: %v", want, err)
	}
	if pkt.Type != want {
		t.Fatalf("received %s, want %s: %v", pkt.Type, want, pkt)
	}
	return pkt
}

// testTLS returns a server TLS config with a self-signed certificate for 127.0.0.1 and a client
// config that trusts it.
func testTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "konnectivity"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}
