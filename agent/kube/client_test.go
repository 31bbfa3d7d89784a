package kube

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// TestClientsetRequests checks the requests of the methods written here rather than by
// gentype, against what client-go's typed clients send: verb, path, content.
func TestClientsetRequests(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/api/v1/namespaces/ns/serviceaccounts/default/token":
			_ = json.NewEncoder(w).Encode(&authenticationv1.TokenRequest{
				TypeMeta: metav1.TypeMeta{APIVersion: "authentication.k8s.io/v1", Kind: "TokenRequest"},
				Status:   authenticationv1.TokenRequestStatus{Token: "t"},
			})
		case r.URL.Path == "/api/v1/nodes/gw/status":
			_ = json.NewEncoder(w).Encode(&v1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: "gw"}})
		case r.URL.Path == "/api/v1/namespaces/ns/pods/web":
			_ = json.NewEncoder(w).Encode(&v1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}})
		default:
			_ = json.NewEncoder(w).Encode(&v1.Event{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Event"}, ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e"}})
		}
	}))
	defer srv.Close()
	cs, err := NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if pod, err := cs.CoreV1().Pods("ns").Get(ctx, "web", metav1.GetOptions{}); err != nil || pod.Name != "web" {
		t.Fatalf("get pod: %v, %v", pod, err)
	}
	if node, err := cs.CoreV1().Nodes().PatchStatus(ctx, "gw", []byte(`{}`)); err != nil || node.Name != "gw" {
		t.Fatalf("patch node status: %v, %v", node, err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("ns").CreateToken(ctx, "default", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil || tr.Status.Token != "t" {
		t.Fatalf("create token: %v, %v", tr, err)
	}
	sink := &EventSink{Interface: cs.CoreV1().Events("")}
	event := &v1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e"}}
	for name, write := range map[string]func() (*v1.Event, error){
		"create": func() (*v1.Event, error) { return sink.Create(event) },
		"update": func() (*v1.Event, error) { return sink.Update(event) },
		"patch":  func() (*v1.Event, error) { return sink.Patch(event, []byte(`{}`)) },
	} {
		if _, err := write(); err != nil {
			t.Fatalf("%s event: %v", name, err)
		}
	}
	if _, err := cs.CoreV1().Events("other").CreateWithEventNamespace(event); err == nil {
		t.Fatal("an event of namespace ns created through a client of namespace other")
	}
	want := map[string]bool{
		"GET /api/v1/namespaces/ns/pods/web ":                                                          true,
		"PATCH /api/v1/nodes/gw/status application/strategic-merge-patch+json":                         true,
		"POST /api/v1/namespaces/ns/serviceaccounts/default/token application/vnd.kubernetes.protobuf": true,
		"POST /api/v1/namespaces/ns/events application/json":                                           true,
		"PUT /api/v1/namespaces/ns/events/e application/json":                                          true,
		"PATCH /api/v1/namespaces/ns/events/e application/strategic-merge-patch+json":                  true,
	}
	mu.Lock()
	defer mu.Unlock()
	for _, g := range got {
		if !want[g] {
			t.Errorf("unexpected request %q", g)
		}
		delete(want, g)
	}
	for w := range want {
		t.Errorf("missing request %q", w)
	}
}
