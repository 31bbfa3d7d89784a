package testenv

// KubeletClientCAFile is the CA of the client certificate the apiserver presents to node APIs
// (--kubelet-client-certificate, user kube-apiserver-kubelet-client in group system:masters,
// as kubeadm makes it): what a node agent's authentication.x509.clientCAFile names.
func (cp *ControlPlane) KubeletClientCAFile() string { return cp.kubeletCA.CertFile }

// kubeletClientArgs writes the apiserver's kubelet client certificate, signed by a CA of its
// own, and returns the flags that make the apiserver present it when it dials a node API
// (logs, exec, port-forward), at the node's InternalIP first, as kubeadm configures it.
func (cp *ControlPlane) kubeletClientArgs() ([]string, error) {
	ca, err := NewCA(cp.Dir, "kubelet-client-ca", "testenv-kubelet-client-ca")
	if err != nil {
		return nil, err
	}
	certFile, keyFile, err := ca.IssueClient(cp.Dir, "kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return nil, err
	}
	cp.kubeletCA = ca
	return []string{
		"--kubelet-client-certificate=" + certFile,
		"--kubelet-client-key=" + keyFile,
		"--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
	}, nil
}
