package services

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func svc(ns, name, ip string, ports ...v1.ServicePort) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1.ServiceSpec{ClusterIP: ip, Ports: ports}}
}

// TestEnvVars: the kubelet's service variables, byte for byte.
func TestEnvVars(t *testing.T) {
	services := []*v1.Service{
		svc("default", "kubernetes", "10.96.0.1", v1.ServicePort{Name: "https", Port: 443, Protocol: v1.ProtocolTCP}),
		svc("shop", "web-front", "10.96.0.20", v1.ServicePort{Port: 80, Protocol: v1.ProtocolTCP}, v1.ServicePort{Name: "metrics", Port: 9090, Protocol: v1.ProtocolUDP}),
		svc("shop", "headless", v1.ClusterIPNone, v1.ServicePort{Port: 80}),
		svc("other", "db", "10.96.0.30", v1.ServicePort{Port: 5432}),
	}
	kubernetes := map[string]string{
		"KUBERNETES_SERVICE_HOST":       "10.96.0.1",
		"KUBERNETES_SERVICE_PORT":       "443",
		"KUBERNETES_SERVICE_PORT_HTTPS": "443",
		"KUBERNETES_PORT":               "tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP":       "tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP_PROTO": "tcp",
		"KUBERNETES_PORT_443_TCP_PORT":  "443",
		"KUBERNETES_PORT_443_TCP_ADDR":  "10.96.0.1",
	}
	if got := EnvVars(services, "shop", false); !reflect.DeepEqual(got, kubernetes) {
		t.Errorf("enableServiceLinks false:\n got %v\nwant %v", got, kubernetes)
	}
	want := map[string]string{
		"WEB_FRONT_SERVICE_HOST":         "10.96.0.20",
		"WEB_FRONT_SERVICE_PORT":         "80",
		"WEB_FRONT_SERVICE_PORT_METRICS": "9090",
		"WEB_FRONT_PORT":                 "tcp://10.96.0.20:80",
		"WEB_FRONT_PORT_80_TCP":          "tcp://10.96.0.20:80",
		"WEB_FRONT_PORT_80_TCP_PROTO":    "tcp",
		"WEB_FRONT_PORT_80_TCP_PORT":     "80",
		"WEB_FRONT_PORT_80_TCP_ADDR":     "10.96.0.20",
		"WEB_FRONT_PORT_9090_UDP":        "udp://10.96.0.20:9090",
		"WEB_FRONT_PORT_9090_UDP_PROTO":  "udp",
		"WEB_FRONT_PORT_9090_UDP_PORT":   "9090",
		"WEB_FRONT_PORT_9090_UDP_ADDR":   "10.96.0.20",
	}
	for k, v := range kubernetes {
		want[k] = v
	}
	if got := EnvVars(services, "shop", true); !reflect.DeepEqual(got, want) {
		t.Errorf("enableServiceLinks true:\n got %v\nwant %v", got, want)
	}
}
