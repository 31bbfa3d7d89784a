package identity

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/agent/events/record"

	"github.com/holdfast-dev/holdfast/agent/identity/certificate"
)

// issueFor returns a certificate of tmpl valid now, signed by ca, and its key (PEM).
func (ca *testCA) issueFor(t *testing.T, tmpl *x509.Certificate) (certPEM, keyPEM []byte) {
	t.Helper()
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	return ca.sign(t, tmpl)
}

// TestIssuedCertificatesChecked: a signer answering a CSR with another node's certificate, or
// one for another use, or a PKI directory copied from another gateway, must not make this node
// present it. client-go's certificate manager stores what the CSR's status holds and loads what
// the directory holds, unchecked: on 2df39b2 each certificate below was stored and used.
func TestIssuedCertificatesChecked(t *testing.T) {
	ca := newTestCA(t)
	node := func(name string, usage x509.ExtKeyUsage, dns []string, ips ...net.IP) *x509.Certificate {
		return &x509.Certificate{Subject: pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}},
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, DNSNames: dns, IPAddresses: ips}
	}
	client := func(c *x509.Certificate) *x509.Certificate { return c }
	gwIP := net.ParseIP("10.0.0.7")
	cases := []struct {
		name    string
		serving bool
		tmpl    *x509.Certificate
		refusal string // "" when it is this node's
	}{
		{"client: this node's", false, client(node("gw", x509.ExtKeyUsageClientAuth, nil)), ""},
		{"client: another node's", false, node("gw-2", x509.ExtKeyUsageClientAuth, nil), `names "system:node:gw-2"`},
		{"client: not in system:nodes", false, &x509.Certificate{Subject: pkix.Name{CommonName: "system:node:gw", Organization: []string{"system:masters"}},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, "lack system:nodes"},
		{"client: a serving certificate", false, node("gw", x509.ExtKeyUsageServerAuth, nil), "lack client auth"},
		{"serving: this node's", true, node("gw", x509.ExtKeyUsageServerAuth, []string{"gw"}, gwIP), ""},
		{"serving: another node's", true, node("gw-2", x509.ExtKeyUsageServerAuth, []string{"gw-2"}), `names "system:node:gw-2"`},
		{"serving: another host's name", true, node("gw", x509.ExtKeyUsageServerAuth, []string{"gw", "apiserver.example"}, gwIP), `"apiserver.example"`},
		{"serving: an address of the node's since changed", true, node("gw", x509.ExtKeyUsageServerAuth, []string{"GW"}, net.ParseIP("10.0.0.99")), ""},
		{"client: no extended key usage", false, &x509.Certificate{Subject: pkix.Name{CommonName: "system:node:gw", Organization: []string{"system:nodes"}}}, ""},
		{"client: any extended key usage", false, node("gw", x509.ExtKeyUsageAny, nil), ""},
		{"serving: a client certificate", true, node("gw", x509.ExtKeyUsageClientAuth, []string{"gw"}), "lack server auth"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var refusals []string
			refused := func(err error) { refusals = append(refusals, err.Error()) }
			prefix := PairPrefix
			if tc.serving {
				prefix = ServingPrefix
			}
			files, err := certificate.NewFileStore(prefix, dir, dir, "", "")
			if err != nil {
				t.Fatal(err)
			}
			var store certificate.Store
			if tc.serving {
				store = servingStore(files, "gw", refused)
			} else {
				store = clientStore(files, "gw", refused)
			}
			certPEM, keyPEM := ca.issueFor(t, tc.tmpl)
			_, err = store.Update(certPEM, keyPEM)
			if tc.refusal == "" {
				if err != nil {
					t.Fatalf("this node's certificate refused: %v", err)
				}
				if _, err := store.Current(); err != nil {
					t.Fatalf("this node's certificate not current: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.refusal) {
				t.Fatalf("Update: %v, want a refusal naming %q", err, tc.refusal)
			}
			var none *certificate.NoCertKeyError
			if _, err := store.Current(); !errors.As(err, &none) {
				t.Fatalf("after the refusal Current: %v, want no certificate", err)
			}
			// The same pair put in the directory by hand (copied from another gateway) is
			// not used either.
			if _, err := files.Update(certPEM, keyPEM); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Current(); !errors.As(err, &none) {
				t.Fatalf("a stored certificate that is not this node's: %v, want none", err)
			}
			if len(refusals) != 2 || !strings.Contains(refusals[1], tc.refusal) {
				t.Errorf("refusals told: %q", refusals)
			}
			if _, err := filepath.Glob(filepath.Join(dir, "*")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A refused client certificate is said where an operator looks: a Warning event on the Node.
func TestRefusedCertificateEvent(t *testing.T) {
	recorder := record.NewFakeRecorder(1)
	id := &Identity{opts: Options{NodeName: "gw", Log: slog.New(slog.DiscardHandler)}, recorder: recorder}
	id.refused(errors.New(`the issued certificate is refused: it names "system:node:gw-2"`))
	select {
	case ev := <-recorder.Events:
		if !strings.HasPrefix(ev, "Warning ClientCertificateRefused") || !strings.Contains(ev, "system:node:gw-2") {
			t.Errorf("event %q", ev)
		}
	default:
		t.Error("no event")
	}
}
