# nginx for the `scale` profile of docker-compose.yml.
#
# Built from python:3.11-slim + Debian's nginx so the stack needs no image other than the one the server uses
# (and works where no registry is reachable). Any nginx >= 1.15.3 works with deploy/nginx.conf: with Docker Hub
# access you can replace the `build:` of the nginx service by `image: nginx:stable`. Python stays in the image for
# the compose healthcheck.
FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends nginx \
 && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/default \
 && mkdir -p /var/cache/nginx \
 && ln -sf /dev/stdout /var/log/nginx/access.log \
 && ln -sf /dev/stderr /var/log/nginx/error.log
# Debian's nginx.conf includes /etc/nginx/conf.d/*.conf inside http {}, like the official image; compose mounts
# deploy/nginx.conf there. The copy below is the default when the image runs without that mount.
COPY nginx.conf /etc/nginx/conf.d/default.conf
EXPOSE 8080
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
