{{/*
openshell.gateway renders the gateway: ServiceAccount, Service and StatefulSet.
Call it with the subchart context: include "openshell.gateway" .Subcharts.openshell
*/}}
{{- define "openshell.gateway" -}}
{{- $name := include "openshell.fullname" . -}}
{{- if not (has .Values.supervisorDelivery (list "hostPath" "initContainer")) -}}
{{- fail (printf "openshell.supervisorDelivery must be hostPath or initContainer, not %q" .Values.supervisorDelivery) -}}
{{- end -}}
{{- if and (eq .Values.supervisorDelivery "initContainer") (not .Values.clusterImage) -}}
{{- fail "openshell.supervisorDelivery=initContainer needs openshell.clusterImage: the image whose copy-self puts the supervisor into each sandbox pod" -}}
{{- end -}}
{{- if and (not .Values.tls.enabled) (eq .Values.supervisorDelivery "initContainer") (not .Values.tls.sandboxImageAllowsPlaintextToken) -}}
{{- fail "openshell.tls.enabled=false with supervisorDelivery=initContainer: this gateway gives every sandbox a token, and the supervisor will not send it in cleartext over the pod network (anyone who sees it can act as that sandbox) unless its container has OPENSHELL_ALLOW_PLAINTEXT_TOKEN=1. The gateway builds sandbox pods, so this chart cannot set it: add `ENV OPENSHELL_ALLOW_PLAINTEXT_TOKEN=1` to openshell.sandboxImage and set openshell.tls.sandboxImageAllowsPlaintextToken=true, or keep openshell.tls.enabled=true" -}}
{{- end }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $name }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "openshell.labels" . | nindent 4 }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "openshell.labels" . | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- include "openshell.selectorLabels" . | nindent 4 }}
  ports:
    # gRPC and HTTP share one port: TLS (ALPN h2 and http/1.1), or plaintext h2c with
    # tls.enabled=false.
    - name: grpc
      port: 8080
      targetPort: grpc
      protocol: TCP
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ $name }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "openshell.labels" . | nindent 4 }}
spec:
  serviceName: {{ $name }}
  # One gateway: its state is a SQLite file on the data volume.
  replicas: 1
  selector:
    matchLabels:
      {{- include "openshell.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "openshell.labels" . | nindent 8 }}
    spec:
      serviceAccountName: {{ $name }}
      securityContext:
        runAsUser: 1000
        runAsGroup: 1000
        runAsNonRoot: true
        fsGroup: 1000
        seccompProfile:
          type: RuntimeDefault
      {{- with .Values.hostGatewayIP }}
      hostAliases:
        - ip: {{ . | quote }}
          hostnames:
            - host.docker.internal
            - host.openshell.internal
      {{- end }}
      containers:
        - name: gateway
          image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          args:
            - --port
            - "8080"
            - --health-port
            - "8081"
            - --log-level
            - {{ .Values.logLevel | quote }}
            - --db-url
            - sqlite:/var/openshell/openshell.db
          env:
            - name: OPENSHELL_SANDBOX_NAMESPACE
              value: {{ .Values.sandboxNamespace | quote }}
            - name: OPENSHELL_SANDBOX_IMAGE
              value: {{ .Values.sandboxImage | quote }}
            {{- with .Values.sandboxImagePullPolicy }}
            - name: OPENSHELL_SANDBOX_IMAGE_PULL_POLICY
              value: {{ . | quote }}
            {{- end }}
            - name: OPENSHELL_GRPC_ENDPOINT
              value: {{ include "openshell.grpcEndpoint" . | quote }}
            {{- with .Values.hostGatewayIP }}
            # The gateway adds the same host aliases to every sandbox pod it creates.
            - name: OPENSHELL_HOST_GATEWAY_IP
              value: {{ . | quote }}
            {{- end }}
            - name: OPENSHELL_SSH_HANDSHAKE_SECRET
              valueFrom:
                secretKeyRef:
                  name: {{ .Values.sshHandshakeSecret }}
                  key: secret
            {{- if .Values.tls.enabled }}
            - name: OPENSHELL_TLS_CERT
              value: /etc/openshell-tls/server/tls.crt
            - name: OPENSHELL_TLS_KEY
              value: /etc/openshell-tls/server/tls.key
            - name: OPENSHELL_TLS_CLIENT_CA
              value: /etc/openshell-tls/client-ca/ca.crt
            - name: OPENSHELL_CLIENT_TLS_SECRET_NAME
              value: {{ .Values.tls.clientSecret | quote }}
            {{- else }}
            # Plaintext h2c on 8080; sandbox pods get no client Secret and dial http://.
            - name: OPENSHELL_DISABLE_TLS
              value: "true"
            {{- end }}
            {{- if eq .Values.supervisorDelivery "initContainer" }}
            # Newer gateways: each sandbox pod gets an init container that runs
            # `/openshell-sandbox copy-self` from this image into an emptyDir.
            - name: OPENSHELL_SUPERVISOR_SIDELOAD_METHOD
              value: init-container
            - name: OPENSHELL_SUPERVISOR_IMAGE
              value: {{ .Values.clusterImage | quote }}
            {{- end }}
          ports:
            - name: grpc
              containerPort: 8080
              protocol: TCP
            - name: health
              containerPort: 8081
              protocol: TCP
          startupProbe:
            httpGet:
              path: /healthz
              port: health
            periodSeconds: 2
            failureThreshold: 60
          livenessProbe:
            httpGet:
              path: /healthz
              port: health
            periodSeconds: 10
          readinessProbe:
            httpGet:
              path: /readyz
              port: health
            periodSeconds: 5
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: ["ALL"]
          {{- with .Values.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: data
              mountPath: /var/openshell
            {{- if .Values.tls.enabled }}
            - name: server-tls
              mountPath: /etc/openshell-tls/server
              readOnly: true
            - name: client-ca
              mountPath: /etc/openshell-tls/client-ca
              readOnly: true
            {{- end }}
            # A writable /tmp, since the root file system is read-only.
            - name: tmp
              mountPath: /tmp
      volumes:
        {{- if .Values.tls.enabled }}
        - name: server-tls
          secret:
            secretName: {{ .Values.tls.serverSecret }}
            defaultMode: 0440
        - name: client-ca
          secret:
            secretName: {{ .Values.tls.clientCaSecret }}
            defaultMode: 0444
        {{- end }}
        - name: tmp
          emptyDir: {}
      {{- with .Values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  volumeClaimTemplates:
    - metadata:
        name: data
      spec:
        accessModes: ["ReadWriteOnce"]
        {{- with .Values.persistence.storageClassName }}
        storageClassName: {{ . | quote }}
        {{- end }}
        resources:
          requests:
            storage: {{ .Values.persistence.size }}
{{- end -}}
