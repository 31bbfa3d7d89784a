package identity

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// With a static kubeconfig too, CloseAllConns ends the requests hung on a dead link: the node
// controller calls it when Lease renewals keep failing (it panicked on a nil dialer here, and
// the agent with it).
func TestCloseAllConnsStaticKubeconfig(t *testing.T) {
	hung := make(chan struct{})
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) > 1 {
			http.NotFound(w, r) // client-go retries a GET whose connection was reset
			return
		}
		select { // a link that took the first request and says nothing
		case <-hung:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(hung)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: srv.URL}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "t"}
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "x"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	id, err := New(Options{NodeName: "gw", Kubeconfig: path})
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(id.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := client.CoreV1().Nodes().Get(context.Background(), "gw", metav1.GetOptions{})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // the request is on the wire
	id.CloseAllConns()
	select {
	case err := <-done:
		if err == nil || requests.Load() < 2 {
			t.Fatalf("err %v after %d requests: want the hung one cut and its retry answered", err, requests.Load())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("CloseAllConns left the hung request hanging")
	}
}
